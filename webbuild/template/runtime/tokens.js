// Token id -> bytes table emitted by the build (webbuild/pipeline/assemble.py token_table):
// u32 count, u32 offsets[count + 1], then the bytes of every token back to back; then the BPE merges by rank
// (webbuild/pipeline/bpe_form.py merges_section: u32 count, two u32 ids each), which runtime/bpe.js encodes with
// (none in a build before them).

export class TokenTable {
  /** @param {Uint8Array} bytes */
  constructor(bytes) {
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.count = view.getUint32(0, true);
    this.offsets = new Uint32Array(this.count + 1);
    for (let i = 0; i <= this.count; i++) this.offsets[i] = view.getUint32(4 + 4 * i, true);
    this.data = bytes.subarray(4 * (this.count + 2), 4 * (this.count + 2) + this.offsets[this.count]);
    const at = 4 * (this.count + 2) + this.offsets[this.count];
    const merges = at + 4 <= bytes.byteLength ? view.getUint32(at, true) : 0;
    /** @type {Uint32Array} the merges' ids, two per merge, by rank */
    this.merges = new Uint32Array(2 * merges);
    for (let i = 0; i < 2 * merges; i++) this.merges[i] = view.getUint32(at + 4 + 4 * i, true);
  }

  /** @param {number} id */
  bytes(id) {
    if (id < 0 || id >= this.count) return new Uint8Array(0);
    return this.data.subarray(this.offsets[id], this.offsets[id + 1]);
  }
}

// Streaming detokeniser: a token may end inside a multi-byte character, which TextDecoder's
// stream mode holds back until the next token completes it.
export class StreamingDecoder {
  /** @param {TokenTable} table */
  constructor(table) {
    this.table = table;
    this.decoder = new TextDecoder('utf-8');
    this.text = '';
  }

  /** @param {number} id */
  push(id) {
    this.text += this.decoder.decode(this.table.bytes(id), { stream: true });
    return this.text;
  }

  finish() {
    this.text += this.decoder.decode();
    return this.text;
  }
}

// The transcript inside the model's answer `language English<asr_text>TEXT<|im_end|>`
// (same rule as webbuild.reference.prompt.parse_answer). While streaming, nothing is shown before the
// text marker arrives.
/**
 * @param {string} decoded
 * @param {import('webbuild-types').Runtime['answer']} answer
 * @param {boolean} [final] the whole answer: without the text marker, all of it
 */
export function answerText(decoded, answer, final = false) {
  const at = decoded.indexOf(answer.text_start);
  if (at < 0) return final ? clean(decoded, answer) : '';
  return clean(decoded.slice(at + answer.text_start.length), answer);
}

/**
 * @param {string} text
 * @param {import('webbuild-types').Runtime['answer']} answer
 */
function clean(text, answer) {
  return text.split(answer.end).join('').split('<|endoftext|>').join('').trim();
}

// The language the answer names, `language <Name><asr_text>` (same rule as webbuild.reference.prompt.parse_language);
// null before the text marker, and where it names none (`language None`: the model heard no speech).
const LANGUAGE_TAG = 'language ';
/**
 * @param {string} decoded
 * @param {import('webbuild-types').Runtime['answer']} answer
 * @returns {string | null}
 */
export function answerLanguage(decoded, answer) {
  const at = decoded.indexOf(answer.text_start);
  if (!decoded.startsWith(LANGUAGE_TAG) || at < 0) return null;
  const name = decoded.slice(LANGUAGE_TAG.length, at).trim();
  return name && name !== 'None' ? name : null;
}

// Byte-level BPE encoder for a visitor's context text, id for id as the model's tokenizer.json encodes it
// (webbuild.reference.prompt.text_ids): NFC where the tokenizer normalises, the pre-tokeniser's regex
// (runtime.json prompt.context.pattern: GPT-2's or Qwen2's, written for JavaScript by the build), each piece's
// UTF-8 bytes as byte tokens, then the merges by rank (tokens.bin carries them after the token bytes), the
// lowest-ranked adjacent pair first, the leftmost of equals. Special tokens are never matched inside the text:
// "<|im_end|>" typed by a visitor is read as its characters, and cannot close the system message.

/** @typedef {import('./tokens.js').TokenTable} TokenTable */
/** @typedef {NonNullable<import('webbuild-types').Runtime['prompt']['context']>} ContextForm */

const PAIR = 2 ** 20; // ids stay below it (Qwen's vocabulary: 151,936): a pair's key is left * PAIR + right

export class BpeEncoder {
  /** @param {TokenTable} table the decode table, merges included @param {ContextForm} form */
  constructor(table, form) {
    this.form = form;
    this.pattern = new RegExp(form.pattern, 'gu');
    /** @type {Map<string, number>} a token's bytes (byteKey) -> its id; the first id of equal bytes */
    this.ids = new Map();
    for (let id = 0; id < table.count; id++) {
      const key = byteKey(table.bytes(id));
      if (key && !this.ids.has(key)) this.ids.set(key, id);
    }
    this.byteIds = Int32Array.from({ length: 256 }, (_, b) => this.ids.get(byteKey(Uint8Array.of(b))) ?? -1);
    /** @type {Map<number, {rank: number, id: number}>} */
    this.merges = new Map();
    const pairs = table.merges;
    for (let rank = 0; rank < pairs.length / 2; rank++) {
      const left = pairs[2 * rank], right = pairs[2 * rank + 1];
      const id = this.ids.get(byteKey(table.bytes(left)) + byteKey(table.bytes(right)));
      const key = left * PAIR + right;
      if (id !== undefined && !this.merges.has(key)) this.merges.set(key, { rank, id });
    }
    this.utf8 = new TextEncoder();
  }

  /** @param {string} text @returns {number[]} */
  encode(text) {
    const normalised = this.form.nfc ? text.normalize('NFC') : text;
    const out = [];
    for (const [piece] of normalised.matchAll(this.pattern)) out.push(...this.piece(piece));
    return out;
  }

  /** @param {string} piece @returns {number[]} */
  piece(piece) {
    const bytes = this.utf8.encode(piece);
    if (this.form.ignore_merges) {
      const whole = this.ids.get(byteKey(bytes));
      if (whole !== undefined) return [whole];
    }
    const ids = Array.from(bytes, (b) => this.byteIds[b]);
    for (;;) {
      let best = -1, bestRank = Infinity, bestId = -1;
      for (let i = 0; i + 1 < ids.length; i++) {
        const merge = this.merges.get(ids[i] * PAIR + ids[i + 1]);
        if (merge && merge.rank < bestRank) [best, bestRank, bestId] = [i, merge.rank, merge.id];
      }
      if (best < 0) return ids;
      ids.splice(best, 2, bestId);
    }
  }

  // The prompt's ids before the audio with `context` in the system message (runtime.json prompt.context: start,
  // lead + context tokenised together as the processor tokenises "system\n{context}", end); '' gives `prefix`.
  /** @param {string} context @param {number[]} prefix runtime.json prompt.prefix @returns {number[]} */
  prefix(context, prefix) {
    if (!context) return prefix;
    return [...this.form.start, ...this.encode(this.form.lead + context), ...this.form.end];
  }
}

// A token's bytes as a map key, one char per byte: windows-1252 is a single-byte encoding that maps every byte
// to its own character (WHATWG Encoding), so keys concatenate as the bytes do; decoded natively, the encoder of
// the zoo 0.6b's 151,705 ids is made in 308 ms instead of 760 with String.fromCharCode (Node, the 2-core box).
const SINGLE_BYTE = new TextDecoder('windows-1252');
/** @param {Uint8Array} bytes @returns {string} */
function byteKey(bytes) {
  return SINGLE_BYTE.decode(bytes);
}

// The tokens a context adds to the prompt, against its budget (runtime.json prompt.context.max_tokens: what
// max_positions leaves after the longest chunk's prompt, longest forced language and answer); the same words as
// the Python reference's error (webbuild.reference.transcribe.check_context_length).
/** @param {number} tokens @param {number} budget */
export function checkContextLength(tokens, budget) {
  if (tokens > budget) {
    throw new Error(`the context text is ${tokens} tokens, over the ${budget} the prompt has room for (the longest `
      + 'chunk\'s prompt and answer must fit the decoder\'s positions); shorten it');
  }
}

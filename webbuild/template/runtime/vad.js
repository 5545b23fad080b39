// Speech detection with Silero VAD (v5, MIT licence) on onnxruntime-web's wasm EP: the twin of
// webbuild/reference/vad.py, whose docstring is the policy. Its numbers come from runtime.json's `vad` (written by
// the build from VadPolicy), so the page and `webbuild transcribe` find the same speech segments (tests/test_vad.py).

/**
 * @typedef {{file: string, sample_rate: number, window: number, context: number, threshold: number,
 *   neg_threshold: number, min_speech_seconds: number, min_silence_seconds: number, pad_seconds: number,
 *   merge_seconds: number}} VadPolicy  merge_seconds: segments closer are one stretch of speech (chunk.js stretches)
 * @typedef {typeof import('onnxruntime-web')} Ort
 */

// A Silero VAD session from the model's bytes, on wasm (a window is far too small for a GPU to pay).
/** @param {Ort} ort @param {Uint8Array} bytes @param {VadPolicy} policy */
export async function createVad(ort, bytes, policy) {
  const session = await ort.InferenceSession.create(bytes, { executionProviders: ['wasm'] });
  return new Vad(ort, session, policy);
}

export class Vad {
  /** @param {Ort} ort @param {import('onnxruntime-web').InferenceSession} session @param {VadPolicy} policy */
  constructor(ort, session, policy) {
    this.ort = ort;
    this.session = session;
    this.policy = policy;
  }

  stream() { return new VadStream(this); }

  // Speech segments [start, end) of a whole recording (the last window padded).
  /** @param {Float32Array} pcm @returns {Promise<Array<[number, number]>>} */
  async segments(pcm) {
    const s = this.stream();
    s.push(pcm);
    await s.advance();
    await s.finish();
    return speechSegments(s.probs, s.samples, this.policy);
  }
}

// Windows judged as audio arrives: push() queues 16 kHz samples (synchronously), advance() judges the complete
// windows queued, finish() the padded last one. probs: each window's probability (float32 values).
export class VadStream {
  /** @param {Vad} vad */
  constructor(vad) {
    const p = vad.policy;
    this.vad = vad;
    this.context = new Float32Array(p.context);
    /** @type {import('onnxruntime-web').Tensor} */
    this.state = new vad.ort.Tensor('float32', new Float32Array(2 * 128), [2, 1, 128]); // the recurrent state
    this.rate = new vad.ort.Tensor('int64', BigInt64Array.from([BigInt(p.sample_rate)]), []);
    this.pending = new Float32Array(0);
    /** @type {number[]} */
    this.probs = [];
    this.samples = 0;
    this.busy = Promise.resolve();
  }

  /** @param {Float32Array} pcm */
  push(pcm) {
    const joined = new Float32Array(this.pending.length + pcm.length);
    joined.set(this.pending);
    joined.set(pcm, this.pending.length);
    this.pending = joined;
    this.samples += pcm.length;
  }

  // Judges every complete window queued (one caller at a time: the state carries from window to window).
  advance() {
    this.busy = this.busy.then(async () => {
      const w = this.vad.policy.window;
      while (this.pending.length >= w) {
        const window = this.pending.slice(0, w);
        this.pending = this.pending.subarray(w);
        await this.judge(window);
      }
    });
    return this.busy;
  }

  async finish() {
    await this.advance();
    if (!this.pending.length) return;
    const window = new Float32Array(this.vad.policy.window);
    window.set(this.pending);
    this.pending = new Float32Array(0);
    await this.judge(window);
  }

  /** @param {Float32Array} window */
  async judge(window) {
    const { ort, session } = this.vad;
    const input = new Float32Array(this.context.length + window.length);
    input.set(this.context);
    input.set(window, this.context.length);
    const out = await session.run({ input: new ort.Tensor('float32', input, [1, input.length]), state: this.state, sr: this.rate });
    this.state = out.stateN;
    this.context = window.slice(window.length - this.context.length);
    this.probs.push(/** @type {Float32Array} */ (out.output.data)[0]);
  }
}

// [start, end) sample ranges of speech in audio of `samples` samples whose windows have these probabilities
// (vad.py speech_segments: Silero's get_speech_timestamps).
/** @param {ArrayLike<number>} probs @param {number} samples @param {VadPolicy} p @returns {Array<[number, number]>} */
export function speechSegments(probs, samples, p) {
  const rate = p.sample_rate, w = p.window;
  const minSpeech = Math.round(p.min_speech_seconds * rate);
  const minSilence = Math.round(p.min_silence_seconds * rate);
  /** @type {Array<[number, number]>} */
  const segments = [];
  let start = 0, tempEnd = 0, triggered = false;
  for (let i = 0; i < probs.length; i++) {
    const prob = probs[i];
    if (prob >= p.threshold && tempEnd) tempEnd = 0;
    if (prob >= p.threshold && !triggered) {
      triggered = true;
      start = w * i;
      continue;
    }
    if (prob < p.neg_threshold && triggered) {
      tempEnd ||= w * i;
      if (w * i - tempEnd < minSilence) continue;
      if (tempEnd - start > minSpeech) segments.push([start, tempEnd]);
      start = 0; tempEnd = 0; triggered = false;
    }
  }
  if (triggered && samples - start > minSpeech) segments.push([start, samples]);
  return padded(segments, samples, Math.round(p.pad_seconds * rate));
}

// Each segment widened by `pad` either side, by half the gap where two would meet (vad.py _padded).
/** @param {Array<[number, number]>} segments @param {number} samples @param {number} pad */
function padded(segments, samples, pad) {
  for (let i = 0; i < segments.length; i++) {
    const s = segments[i];
    if (i === 0) s[0] = Math.max(0, s[0] - pad);
    if (i + 1 < segments.length) {
      const gap = segments[i + 1][0] - s[1];
      if (gap < 2 * pad) {
        s[1] += Math.floor(gap / 2);
        segments[i + 1][0] = Math.max(0, segments[i + 1][0] - Math.floor(gap / 2));
      } else {
        s[1] = Math.min(samples, s[1] + pad);
        segments[i + 1][0] = Math.max(0, segments[i + 1][0] - pad);
      }
    } else {
      s[1] = Math.min(samples, s[1] + pad);
    }
  }
  return segments;
}

// Whether the windows lying wholly within [start, end) have a speech segment (vad.py window_speech).
/** @param {ArrayLike<number>} probs @param {number} start @param {number} end @param {VadPolicy} p */
export function windowSpeech(probs, start, end, p) {
  const w = p.window, first = Math.ceil(start / w), last = Math.floor(end / w);
  if (last <= first) return false;
  return speechSegments(Array.prototype.slice.call(probs, first, last), (last - first) * w, p).length > 0;
}

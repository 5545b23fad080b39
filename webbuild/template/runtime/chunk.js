// Long audio cut into chunks the model transcribes one at a time, at pauses: the twin of
// webbuild/reference/chunk.py, whose docstring is the policy. Its numbers come from runtime.json's
// `chunking` (written by the build from ChunkPolicy), so the page and `webbuild transcribe` cut the same
// audio at the same samples (tests/test_chunk.py). `Chunker` takes blocks (a streamed file) and cuts
// where splitAtQuiet cuts the whole. `LiveChunker` cuts live audio (the microphone) under the live parameter set
// (runtime.json's `chunking_live`, ChunkPolicy.live()): a chunk ends as soon as a pause after speech is heard.

/**
 * @typedef {{max_seconds: number, min_seconds: number, join_seconds: number, pause_seconds: number,
 *   pause_ratio: number, below_peak: number, keep_seconds: number, floor_seconds: number,
 *   frame_seconds: number, smooth_frames: number, tie: number, tokens_per_second?: number}} ChunkPolicy
 *   tokens_per_second: a chunk's decode bound per second of its audio (tokenBudget); absent or 0: none
 */

// ChunkPolicy's defaults, for sites built before runtime.json carried `chunking`
/** @type {ChunkPolicy} */
export const DEFAULT_CHUNKING = {
  max_seconds: 30, min_seconds: 15, join_seconds: 30, pause_seconds: 0.25, pause_ratio: 4, below_peak: 0.01,
  keep_seconds: 0.1, floor_seconds: 1, frame_seconds: 0.02, smooth_frames: 5, tie: 1e-6, tokens_per_second: 0,
};

// ChunkPolicy.live() of a policy, for sites built before runtime.json carried `chunking_live`
export const LIVE_MAX_SECONDS = 15;
export const LIVE_FLOOR_SECONDS = 0.3;
export const LIVE_TOKENS_PER_SECOND = 10;
/** @param {ChunkPolicy} p @returns {ChunkPolicy} */
export function livePolicy(p) {
  const longest = Math.min(p.max_seconds, LIVE_MAX_SECONDS);
  return { ...p, max_seconds: longest, min_seconds: longest / 2, join_seconds: 0, floor_seconds: Math.min(p.floor_seconds, LIVE_FLOOR_SECONDS),
    tokens_per_second: LIVE_TOKENS_PER_SECOND };
}

// The tokens a chunk of `samples` may decode: `most`, bounded by the policy's tokens_per_second (chunk.py token_budget).
/** @param {ChunkPolicy} p @param {number} samples @param {number} rate @param {number} most */
export function tokenBudget(p, samples, rate, most) {
  const perSecond = p.tokens_per_second ?? 0;
  return perSecond > 0 ? Math.min(most, Math.ceil((samples * perSecond) / rate)) : most;
}

// The policy in samples and frames at `rate` (chunk.py Sizes).
/** @param {ChunkPolicy} p @param {number} rate */
function sizes(p, rate) {
  const frames = (/** @type {number} */ s) => Math.floor(s / p.frame_seconds + 0.5);
  const z = {
    max: Math.floor(p.max_seconds * rate), min: Math.floor(p.min_seconds * rate), join: Math.floor(p.join_seconds * rate),
    frame: Math.max(1, Math.floor(p.frame_seconds * rate)), pause: Math.max(1, frames(p.pause_seconds)),
    floor: frames(p.floor_seconds), smooth: p.smooth_frames, keep: Math.floor(p.keep_seconds * rate), look: 0,
  };
  z.look = z.max + (z.floor + z.smooth) * z.frame;
  return z;
}

// Per frame, its energy plus the next smooth - 1 frames' (float64, summed in order).
/** @param {Float32Array} pcm @param {number} frame @param {number} k */
function smoothed(pcm, frame, k) {
  const count = Math.floor(pcm.length / frame);
  const energy = new Float64Array(count);
  for (let f = 0; f < count; f++) {
    let e = 0;
    for (let i = f * frame; i < (f + 1) * frame; i++) e += pcm[i] * pcm[i];
    energy[f] = e;
  }
  const s = new Float64Array(count);
  for (let f = 0; f < count; f++) {
    let e = energy[f];
    for (let j = 1; j < k; j++) e += f + j < count ? energy[f + j] : 0;
    s[f] = e;
  }
  return s;
}

// Where each pause of pcm is cut (samples), in order.
/** @param {Float32Array} pcm @param {ChunkPolicy} p @param {ReturnType<typeof sizes>} z */
function pauseCuts(pcm, p, z) {
  const s = smoothed(pcm, z.frame, z.smooth);
  const count = s.length;
  const quiet = new Uint8Array(count);
  for (let f = 0; f < count; f++) {
    let lo = Infinity, hi = -Infinity;
    for (let g = Math.max(0, f - z.floor); g <= Math.min(count - 1, f + z.floor); g++) {
      lo = Math.min(lo, s[g]);
      hi = Math.max(hi, s[g]);
    }
    quiet[f] = s[f] <= lo * p.pause_ratio || s[f] <= hi * p.below_peak ? 1 : 0;
  }
  const cuts = [];
  for (let f = 0; f < count;) {
    if (!quiet[f]) { f++; continue; }
    let last = f;
    while (last + 1 < count && quiet[last + 1]) last++;
    if (f > 0 && last < count - 1 && last - f + 1 >= z.pause) {
      const middle = Math.floor(((f + last + z.smooth) / 2) * z.frame + 0.5);
      cuts.push(Math.max(middle, (last + z.smooth) * z.frame - z.keep));
    }
    f = last + 1;
  }
  return cuts;
}

// The middle of the first quietest run of frames of pcm, as an index into it.
/** @param {Float32Array} pcm @param {ChunkPolicy} p @param {number} frame @param {number} k */
function quietest(pcm, p, frame, k) {
  const s = smoothed(pcm, frame, k);
  if (!s.length) return pcm.length;
  let least = Infinity;
  for (const e of s) least = Math.min(least, e);
  const first = s.findIndex((e) => e <= least * (1 + p.tie));
  let last = first;
  while (last + 1 < s.length && s[last + 1] <= least * (1 + p.tie)) last++;
  return Math.min(pcm.length, Math.floor(((first + last + k) / 2) * frame + 0.5));
}

// Where the chunk that starts buf ends; buf holds at least z.look samples unless it reaches the end (final).
/** @param {Float32Array} buf @param {boolean} final @param {ChunkPolicy} p @param {ReturnType<typeof sizes>} z */
function nextCut(buf, final, p, z) {
  const n = buf.length;
  const cuts = pauseCuts(buf.subarray(0, z.look), p, z).filter((c) => c <= z.max);
  const joined = cuts.filter((c) => c <= z.join);
  if (final && n <= z.join && n <= z.max) return n;
  if (joined.length) return joined[joined.length - 1];
  if (cuts.length) return cuts[0];
  if (final && n <= z.max) return n;
  return z.min + quietest(buf.subarray(z.min, z.max), p, z.frame, z.smooth);
}

// a then b, in a new array
/** @param {Float32Array} a @param {Float32Array} b */
function joined(a, b) {
  const out = new Float32Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

export class Chunker {
  /** @param {number} rate @param {ChunkPolicy} policy */
  constructor(rate, policy) {
    this.policy = policy;
    this.z = sizes(policy, rate);
    this.buf = new Float32Array(0);
    this.start = 0; // sample index of buf[0]
    this.emitted = 0;
  }

  // [start, chunk] for every chunk the audio so far decides.
  /** @param {Float32Array} block @returns {Array<[number, Float32Array]>} */
  feed(block) {
    this.buf = joined(this.buf, block);
    const out = [];
    while (this.buf.length >= this.z.look) out.push(this.take(nextCut(this.buf, false, this.policy, this.z)));
    return out;
  }

  /** @returns {Array<[number, Float32Array]>} */
  finish() {
    const out = [];
    while (this.buf.length || !this.emitted) {
      out.push(this.take(this.buf.length ? nextCut(this.buf, true, this.policy, this.z) : 0));
    }
    return out;
  }

  /** @param {number} cut @returns {[number, Float32Array]} */
  take(cut) {
    const piece = this.buf.subarray(0, cut);
    this.buf = this.buf.subarray(cut);
    const start = this.start;
    this.start += cut;
    this.emitted++;
    return [start, piece];
  }
}

// [start, end) sample ranges covering pcm, cut at pauses as `policy` says.
/** @param {Float32Array} pcm @param {number} sampleRate @param {ChunkPolicy} policy @returns {Array<[number, number]>} */
export function splitAtQuiet(pcm, sampleRate, policy) {
  const chunker = new Chunker(sampleRate, policy);
  return [...chunker.feed(pcm), ...chunker.finish()].map(([start, piece]) => [start, start + piece.length]);
}

// Chunks of live 16 kHz audio, the twin of chunk.py LiveChunker (its docstring and the module's: frames judged
// one at a time, in order, each once its neighbours have arrived; the first pause after speech ends the chunk,
// cut in its middle; without one, the quietest stretch after min_seconds at max_seconds). `buf`: the open
// chunk's audio; `spoke`: whether a frame of it judged so far is not quiet.
export class LiveChunker {
  /** @param {number} rate @param {ChunkPolicy} policy */
  constructor(rate, policy) {
    this.policy = policy;
    this.rate = rate;
    this.z = sizes(policy, rate);
    this.buf = new Float32Array(0);
    this.start = 0; // sample index of buf[0]
    this.emitted = 0;
    this.frames = { energy: [], smooth: [], judged: 0, spoke: false, run: 0 };
  }

  // How long after the speech ends a pause's cut is decided (seconds).
  get lagSeconds() {
    const z = this.z;
    return ((z.pause + z.floor + z.smooth - 1) * z.frame) / this.rate;
  }

  // A new chunk begins at buf[0]: its frames are judged from the first.
  open() {
    /** @type {{energy: number[], smooth: number[], judged: number, spoke: boolean, run: number}} */
    this.frames = { energy: [], smooth: [], judged: 0, spoke: false, run: 0 }; // run: quiet frames since one that was not
  }

  get spoke() { return this.frames.spoke; }

  // [start, chunk, speech] for every chunk the audio so far ends (one without speech is not transcribed).
  /** @param {Float32Array} block @returns {Array<[number, Float32Array, boolean]>} */
  feed(block) {
    this.buf = joined(this.buf, block);
    const out = [];
    for (let cut = this.decide(); cut !== null; cut = this.decide()) out.push(this.take(...cut));
    return out;
  }

  // The rest, once the audio has ended.
  /** @returns {Array<[number, Float32Array, boolean]>} */
  finish() {
    const out = [];
    while (this.buf.length > this.z.max) out.push(this.take(this.longest(), this.spoke));
    if (this.buf.length || !this.emitted) out.push(this.take(this.buf.length, true));
    return out;
  }

  /** @returns {[number, boolean] | null} */
  decide() {
    const z = this.z, fr = this.frames;
    while ((fr.energy.length + 1) * z.frame <= this.buf.length) {
      const f = fr.energy.length;
      let e = 0;
      for (let i = f * z.frame; i < (f + 1) * z.frame; i++) e += this.buf[i] * this.buf[i];
      fr.energy.push(e);
      if (fr.energy.length >= z.smooth) {
        const g = fr.energy.length - z.smooth;
        let sum = fr.energy[g];
        for (let j = 1; j < z.smooth; j++) sum += fr.energy[g + j];
        fr.smooth.push(sum);
      }
      while (fr.judged + z.floor < fr.smooth.length) {
        const cut = this.judge(fr.judged);
        if (cut !== null) return cut;
      }
      if (fr.energy.length * z.frame >= z.max) return [this.longest(), fr.spoke];
    }
    return null;
  }

  // Judges frame f: the cut when it completes a pause after speech, or ends a long leading quiet.
  /** @param {number} f @returns {[number, boolean] | null} */
  judge(f) {
    const z = this.z, fr = this.frames, s = fr.smooth, p = this.policy;
    let lo = Infinity, hi = -Infinity;
    for (let g = Math.max(0, f - z.floor); g <= f + z.floor; g++) {
      lo = Math.min(lo, s[g]);
      hi = Math.max(hi, s[g]);
    }
    const quiet = s[f] <= lo * p.pause_ratio || s[f] <= hi * p.below_peak;
    fr.judged++;
    const lead = (f - 1 + z.smooth) * z.frame - z.keep;
    if (!quiet && !fr.spoke && lead >= z.keep + z.smooth * z.frame) return [lead, false];
    fr.spoke ||= !quiet;
    fr.run = quiet ? fr.run + 1 : 0;
    if (!(fr.spoke && fr.run >= z.pause)) return null;
    const first = f - fr.run + 1;
    return [Math.floor(((first + f + z.smooth) / 2) * z.frame + 0.5), true];
  }

  longest() {
    const z = this.z;
    return z.min + quietest(this.buf.subarray(z.min, z.max), this.policy, z.frame, z.smooth);
  }

  /** @param {number} cut @param {boolean} speech @returns {[number, Float32Array, boolean]} */
  take(cut, speech) {
    const piece = this.buf.subarray(0, cut);
    this.buf = this.buf.subarray(cut);
    const start = this.start;
    this.start += cut;
    this.emitted++;
    this.open();
    return [start, piece, speech];
  }
}

// Speech segments joined where less than `gap` samples apart: stretches of speech (chunk.py stretches).
/** @param {Array<[number, number]>} segments @param {number} gap @returns {Array<[number, number]>} */
export function stretches(segments, gap) {
  /** @type {Array<[number, number]>} */
  const out = [];
  for (const [a, b] of segments) {
    if (out.length && a - out[out.length - 1][1] < gap) out[out.length - 1] = [out[out.length - 1][0], b];
    else out.push([a, b]);
  }
  return out;
}

// Chunks [start, end) folded onto stretches of speech (chunk.py to_speech): each chunk's parts within a stretch,
// `keep_seconds` wider within it; a chunk without speech gives none.
/** @param {Array<[number, number]>} chunks @param {Array<[number, number]>} speech @param {number} rate @param {ChunkPolicy} policy
 *  @returns {Array<[number, number]>} */
export function toSpeech(chunks, speech, rate, policy) {
  const keep = sizes(policy, rate).keep;
  return chunks.flatMap(([start, end]) => speech.filter(([a, b]) => a < end && b > start)
    .map(([a, b]) => /** @type {[number, number]} */ ([Math.max(start, a - keep), Math.min(end, b + keep)])));
}

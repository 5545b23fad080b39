// Live transcription: PCM frames as they arrive (a microphone's) -> the project's resampler -> 16 kHz ->
// LiveChunker under runtime.json's `chunking_live` (runtime/chunk.js): a chunk ends at the first pause after
// speech. While a chunk is open its audio so far is transcribed again every `intervalMs` (a partial text,
// replaced as the chunk grows); a chunk that ends is transcribed once more (its final text, which never
// changes). Finals go before partials. `webbuild transcribe --live` is the Python reference: the same cuts and,
// chunk by chunk, the same final tokens.
//
// The update interval comes from the measured speed: at least BASE_INTERVAL_MS of the EP (longer on wasm), and
// at least twice the last partial's compute time, so partials never take more than half the time and a final
// waits for at most one partial. Every time is a wall clock in ms (performance.timeOrigin + now(), one clock
// for the page and the worker); `capturedAt` is when a block's last sample was captured.

import { DEFAULT_CHUNKING, LiveChunker, livePolicy, tokenBudget } from './chunk.js';
import { Resampler } from './resample.js';
import { windowSpeech } from './vad.js';

export const BASE_INTERVAL_MS = { webgpu: 300, wasm: 1000 };
export const wallClock = () => performance.timeOrigin + performance.now();

/** @typedef {import('./asr.js').Recogniser} Recogniser */
/** @typedef {import('./contract.js').LiveUpdate} LiveUpdate */
/** @typedef {import('./contract.js').LiveMetrics} LiveMetrics */

export class LiveSession {
  /**
   * @param {Recogniser} recogniser
   * @param {import('webbuild-types').Runtime} runtime
   * @param {{rate: number, ep: string, maxNewTokens?: number, context?: string, language?: string | null,
   *   vad?: import('./vad.js').Vad | null, onUpdate: (u: LiveUpdate) => void}} options
   *   rate: the frames' sample rate; context: the context text of every chunk's prompt, language: the answer's
   *   language forced in every chunk (null: the model names it; asr.js transcribe); vad: speech
   *   detection (a chunk whose own windows hold no speech segment is not transcribed, vad.js windowSpeech);
   *   onUpdate: each partial or final text as it is made
   */
  constructor(recogniser, runtime, { rate, ep, maxNewTokens, context = '', language = null, vad = null, onUpdate }) {
    this.recogniser = recogniser;
    this.prompt = { context, language }; // every chunk's, partial and final
    this.sampleRate = runtime.sample_rate;
    this.maxNewTokens = maxNewTokens ?? runtime.max_new_tokens;
    this.onUpdate = onUpdate;
    this.resampler = new Resampler(rate, this.sampleRate);
    this.policy = runtime.chunking_live ?? livePolicy(runtime.chunking ?? DEFAULT_CHUNKING);
    this.chunker = new LiveChunker(this.sampleRate, this.policy);
    this.vad = vad && vad.stream(); // each window's speech probability, from the session's first sample
    this.baseMs = ep === 'webgpu' ? BASE_INTERVAL_MS.webgpu : BASE_INTERVAL_MS.wasm;
    this.intervalMs = this.baseMs;
    /** @type {{index: number, start: number, pcm: Float32Array, speech: boolean, decidedAt: number, byPause: boolean}[]} */
    this.finals = []; // ended chunks waiting for their final text
    this.ended = 0; // chunks ended so far: the open chunk's index
    /** @type {Array<[number, number]>} */
    this.arrivals = []; // [16 kHz samples so far, wall time] per block: when each sample was captured
    this.heard = 0; // 16 kHz samples so far
    this.busy = false;
    this.stopped = false;
    this.lastPartial = { at: -Infinity, samples: 0 };
    /** @type {ReturnType<typeof setTimeout> | null} */
    this.timer = null;
    /** @type {LiveUpdate[]} */
    this.updates = [];
    this.computeMs = 0; // time spent transcribing, partials and finals
    /** @type {(() => void) | null} */
    this.drained = null;
  }

  // One block of frames at the session's rate; capturedAt: when its last sample was captured.
  /** @param {Float32Array} frames @param {number} [capturedAt] */
  push(frames, capturedAt = wallClock()) {
    if (this.stopped) return;
    this.take(this.resampler.push(frames), capturedAt, false);
    this.pump();
  }

  // The audio has ended: the open chunk is its last. Resolves once every final text is made.
  /** @param {number} [at] */
  async stop(at = wallClock()) {
    if (this.stopped) return this.summary();
    this.take(this.resampler.finish(), at, true);
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    const drained = new Promise((resolve) => { this.drained = () => resolve(undefined); });
    this.pump();
    await drained;
    return this.summary();
  }

  /** @param {Float64Array} pcm16 @param {number} at @param {boolean} last */
  take(pcm16, at, last) {
    this.heard += pcm16.length;
    this.arrivals.push([this.heard, at]);
    this.vad?.push(Float32Array.from(pcm16)); // judged in pump(), before any chunk it ends is finalised
    const ended = [...this.chunker.feed(Float32Array.from(pcm16)), ...(last ? this.chunker.finish() : [])];
    for (const [start, pcm, speech] of ended) this.finals.push({ index: this.ended++, start, pcm, speech, decidedAt: at, byPause: !last });
  }

  // When sample n (16 kHz, from the session's start) was captured: its block's time less the samples after it.
  /** @param {number} n */
  capturedAt(n) {
    const block = this.arrivals.find(([upto]) => upto >= n) ?? this.arrivals[this.arrivals.length - 1];
    return block[1] - ((block[0] - n) / this.sampleRate) * 1000;
  }

  async pump() {
    if (this.busy) return;
    this.busy = true;
    try {
      for (;;) {
        await this.vad?.advance();
        const final = this.finals.shift();
        if (final) await this.finalize(final);
        else if (this.partialDue()) await this.partial();
        else break;
      }
    } finally {
      this.busy = false;
    }
    if (this.stopped) this.drained?.();
    else this.schedule();
  }

  // A partial is due when the open chunk has speech, has grown since the last one, and the interval has passed.
  partialDue() {
    const c = this.chunker;
    return !this.stopped && c.spoke && c.start + c.buf.length > this.lastPartial.samples
      && wallClock() - this.lastPartial.at >= this.intervalMs && this.speechIn(c.start, c.start + c.buf.length);
  }

  // Whether [start, end) holds speech by the speech detection's windows so far (true without speech detection).
  /** @param {number} start @param {number} end */
  speechIn(start, end) {
    return !this.vad || windowSpeech(this.vad.probs, start, end, this.vad.vad.policy);
  }

  schedule() {
    if (this.timer || !this.chunker.spoke) return;
    const wait = Math.max(0, this.lastPartial.at + this.intervalMs - wallClock());
    this.timer = setTimeout(() => { this.timer = null; this.pump(); }, wait);
  }

  async partial() {
    const c = this.chunker, index = this.ended, end = c.start + c.buf.length;
    const t0 = wallClock();
    this.lastPartial = { at: t0, samples: end };
    // a chunk that ends meanwhile stops the partial at its next token: its final is what is shown next
    const r = await this.recogniser.transcribe(c.buf, { maxNewTokens: this.budget(c.buf.length), stop: () => this.ended !== index, ...this.prompt });
    const shownAt = wallClock();
    this.computeMs += shownAt - t0;
    if (this.ended !== index) return; // the chunk ended meanwhile: its final comes next
    this.intervalMs = Math.max(this.baseMs, 2 * (shownAt - t0));
    this.emit({ chunk: index, final: false, text: r.text, tokens: r.tokens, margins: r.margins, start: c.start, end,
      audioAt: this.capturedAt(end), shownAt, computeMs: shownAt - t0, intervalMs: this.intervalMs });
  }

  // A chunk without speech (LiveChunker: a pause's rest) is final with no text, untranscribed, as in the reference.
  /** @param {{index: number, start: number, pcm: Float32Array, speech: boolean, decidedAt: number, byPause: boolean}} f */
  async finalize(f) {
    const t0 = wallClock();
    const speech = f.speech && this.speechIn(f.start, f.start + f.pcm.length);
    const r = speech ? await this.recogniser.transcribe(f.pcm, { maxNewTokens: this.budget(f.pcm.length), ...this.prompt }) : { text: '', tokens: [], margins: [] };
    const shownAt = wallClock();
    this.computeMs += shownAt - t0;
    this.emit({ chunk: f.index, final: true, text: r.text, tokens: r.tokens, margins: r.margins, start: f.start,
      end: f.start + f.pcm.length, audioAt: f.decidedAt, shownAt, computeMs: shownAt - t0, intervalMs: this.intervalMs,
      byPause: f.byPause && speech });
  }

  // The tokens a chunk of `samples` may decode (the live policy's tokens_per_second; the reference's the same).
  /** @param {number} samples */
  budget(samples) {
    return tokenBudget(this.policy, samples, this.sampleRate, this.maxNewTokens);
  }

  /** @param {LiveUpdate} u */
  emit(u) {
    this.updates.push(u);
    this.onUpdate(u);
  }

  // The session's metrics (contract.js LiveMetrics) over its updates so far.
  /** @returns {LiveMetrics} */
  summary() {
    const finals = this.updates.filter((u) => u.final);
    const partials = this.updates.filter((u) => !u.final);
    // a word that ended just after an update's audio first shows in the chunk's next update: its worst case
    const wordBound = this.updates.flatMap((u, i) => {
      const prev = this.updates.slice(0, i).reverse().find((p) => p.chunk === u.chunk);
      return prev ? [u.shownAt - this.capturedAt(prev.end)] : [];
    });
    return {
      chunks: finals.length,
      audio_ms: (this.heard / this.sampleRate) * 1000,
      partials: partials.length,
      interval_ms: this.intervalMs,
      pause_lag_ms: this.chunker.lagSeconds * 1000,
      partial_lag_ms: stats(partials.map((u) => u.shownAt - u.audioAt)),
      pause_to_final_ms: stats(finals.filter((u) => u.byPause).map((u) => u.shownAt - u.audioAt)),
      word_delay_bound_ms: stats(wordBound),
      rtf: this.computeMs / ((this.heard / this.sampleRate) * 1000 || 1),
    };
  }
}

// Mean, median and largest of `xs` (null where there are none).
/** @param {number[]} xs @returns {{n: number, mean: number, median: number, max: number} | null} */
export function stats(xs) {
  if (!xs.length) return null;
  const sorted = [...xs].sort((a, b) => a - b);
  return { n: xs.length, mean: xs.reduce((a, b) => a + b, 0) / xs.length, median: sorted[Math.floor(sorted.length / 2)],
    max: sorted[sorted.length - 1] };
}

// The page's live mode: the microphone's frames captured continuously by an AudioWorklet
// (app/capture-worklet.js) and sent to the worker as they come (live-audio), whose LiveSession (runtime/live.js)
// answers with partial and final texts. `LiveView` keeps what the page shows: the finals, which never change,
// then the open chunk's partial, replaced as it grows.

import { openMicrophone } from './audio.js';
import { wallClock } from '../runtime/live.js';

export class MicFrames {
  // keep: also keep every frame (the page's ?keep_audio=1; audio() gives them back for a reference run)
  constructor(keep = false) {
    this.keep = keep;
    /** @type {Float32Array[]} */
    this.kept = [];
    /** @type {MediaStream | null} */
    this.stream = null;
    /** @type {AudioContext | null} */
    this.ctx = null;
    this.rate = 0;
  }

  // Opens the microphone, calls onStart(rate) with the frames' rate, then onFrames(frames, capturedAt) for
  // every block (capturedAt: when the page got it, ms of wallClock()).
  /** @param {(rate: number) => void} onStart @param {(frames: Float32Array, capturedAt: number) => void} onFrames */
  async start(onStart, onFrames) {
    this.stream = await openMicrophone();
    try {
      const ctx = (this.ctx = new AudioContext());
      await ctx.audioWorklet.addModule(new URL('./capture-worklet.js', import.meta.url));
      const node = new AudioWorkletNode(ctx, 'webbuild-capture');
      node.port.onmessage = (/** @type {MessageEvent<Float32Array>} */ { data }) => {
        if (!this.stream) return; // stopped: frames still in flight are not part of the recording
        if (this.keep) this.kept.push(data.slice());
        onFrames(data, wallClock());
      };
      this.rate = ctx.sampleRate;
      onStart(this.rate);
      ctx.createMediaStreamSource(this.stream).connect(node);
    } catch (e) {
      await this.stop();
      throw new Error(`the microphone's audio could not be captured (${e?.message ?? e})`);
    }
  }

  async stop() {
    this.stream?.getTracks().forEach((t) => t.stop()); // turns the browser's recording indicator off
    await this.ctx?.close();
    this.stream = null;
    this.ctx = null;
  }

  // The kept frames as one array, base64 of its float32 bytes (for Playwright's evaluate).
  audio() {
    const all = new Float32Array(this.kept.reduce((n, k) => n + k.length, 0));
    let at = 0;
    for (const k of this.kept) { all.set(k, at); at += k.length; }
    const bytes = new Uint8Array(all.buffer);
    let text = '';
    for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
    return btoa(text);
  }
}

// What the live mode shows: final texts by chunk, and the open chunk's partial (dropped once its final comes).
export class LiveView {
  constructor() {
    /** @type {string[]} */
    this.finals = [];
    this.partial = '';
    /** @type {import('../runtime/contract.js').LiveUpdate[]} */
    this.updates = [];
  }

  /** @param {import('../runtime/contract.js').LiveUpdate} u */
  add(u) {
    this.updates.push(u);
    if (u.final) {
      this.finals[u.chunk] = u.text;
      this.partial = '';
    } else if (u.chunk === this.finals.length) {
      this.partial = u.text;
    }
  }

  get finalText() { return this.finals.filter(Boolean).join(' '); }
}

// The interval between partial texts, as the page says it.
/** @param {number} ms @param {string} ep */
export function intervalNote(ms, ep) {
  const where = ep === 'webgpu' ? 'WebGPU' : 'WebAssembly (CPU), which is slower';
  return `partial text every ${(ms / 1000).toFixed(1)} s, measured from the model's speed on ${where}`;
}

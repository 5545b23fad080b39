// The live mode's capture (app/live.js): an AudioWorklet that hands the microphone's frames to the page as they
// come, mono (channels averaged), in blocks of BLOCK frames, at the AudioContext's rate. No MediaRecorder, no
// browser resampling: the page's resampler takes them to 16 kHz.

const BLOCK = 1024; // ~21 ms at 48 kHz: few messages, little delay
// the AudioWorkletGlobalScope's names (TypeScript's DOM library has none of them)
const scope = /** @type {any} */ (globalThis);

class Capture extends scope.AudioWorkletProcessor {
  constructor() {
    super();
    this.block = new Float32Array(BLOCK);
    this.filled = 0;
  }

  /** @param {Float32Array[][]} inputs */
  process(inputs) {
    const channels = inputs[0] ?? [];
    const n = channels[0]?.length ?? 0;
    for (let i = 0; i < n; i++) {
      let sum = 0;
      for (const c of channels) sum += c[i];
      this.block[this.filled++] = sum / channels.length;
      if (this.filled === BLOCK) {
        this.port.postMessage(this.block, [this.block.buffer]);
        this.block = new Float32Array(BLOCK);
        this.filled = 0;
      }
    }
    return true;
  }
}

scope.registerProcessor('webbuild-capture', Capture);

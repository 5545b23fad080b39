// Audio in the page: any file the browser can decode -> 16 kHz mono Float32Array, and
// microphone recording that starts only on a click.
//
// The 16 kHz samples are the Python reference's (webbuild/reference/audio.py), not the browser's: WAV is
// parsed here (runtime/wav.js) and every rate goes through the project's resampler (runtime/resample.js).
// Other containers are decoded by the browser at the file's own rate where the header tells it (the
// browser then resamples nothing), else at 48 kHz, then resampled the same way.

import { Resampler } from '../runtime/resample.js';
import { WavError, isWav, parseWav } from '../runtime/wav.js';

export const SAMPLE_RATE = 16000;
const FALLBACK_RATE = 48000; // Opus (WebM, the microphone's recording) always decodes at 48 kHz

// `name`: how the messages name the audio (a file name, "the recording").
/** @param {ArrayBuffer} arrayBuffer @param {string} [name] @returns {Promise<Float32Array>} */
export async function decodeToMono16k(arrayBuffer, name = 'the audio') {
  if (!arrayBuffer.byteLength) throw new Error(`${name}: the file is empty`);
  try {
    const decoded = isWav(arrayBuffer) ? parseWav(arrayBuffer) : await decodeContainer(arrayBuffer);
    return to16k(decoded.blocks, decoded.frames, decoded.rate);
  } catch (e) {
    if (e instanceof WavError) throw new Error(`${name}: ${e.message}`);
    throw new Error(`${name}: this file could not be decoded as audio (${e?.message || e?.name || 'unknown format'}); ` +
      'it is damaged or not a sound file this browser reads: choose a WAV, MP3, FLAC or Ogg file');
  }
}

// 16 kHz float32 from float64 blocks at `rate`, `frames` in all (the reference's read_wav: resample, then
// float32), written into one array as they come.
/** @param {Iterable<Float64Array>} blocks @param {number} frames @param {number} rate */
export function to16k(blocks, frames, rate) {
  const r = new Resampler(rate, SAMPLE_RATE);
  const out = new Float32Array(Math.ceil((frames * r.d.up) / r.d.down));
  let at = 0;
  for (const block of blocks) {
    const part = r.push(block);
    out.set(part, at);
    at += part.length;
  }
  out.set(r.finish(), at);
  return out;
}

// A compressed file decoded by the browser, at the rate its header gives (else 48 kHz), channels averaged.
/** @param {ArrayBuffer} buffer @returns {Promise<{blocks: Float64Array[], frames: number, rate: number}>} */
async function decodeContainer(buffer) {
  const rate = containerRate(new Uint8Array(buffer)) ?? FALLBACK_RATE;
  const ctx = new OfflineAudioContext({ numberOfChannels: 1, length: 1, sampleRate: rate });
  const audio = await ctx.decodeAudioData(buffer);
  const pcm = new Float64Array(audio.length);
  const channels = Array.from({ length: audio.numberOfChannels }, (_, c) => audio.getChannelData(c));
  for (let i = 0; i < pcm.length; i++) {
    let sum = channels[0][i];
    for (let c = 1; c < channels.length; c++) sum += channels[c][i];
    pcm[i] = channels.length > 1 ? sum / channels.length : sum;
  }
  return { blocks: [pcm], frames: pcm.length, rate: audio.sampleRate };
}

// The sample rate a FLAC, Ogg (Opus, Vorbis) or MP3 header states; null where it says none that is known here.
/** @param {Uint8Array} b @returns {number | null} */
export function containerRate(b) {
  const text = (/** @type {number} */ at, /** @type {number} */ n) => String.fromCharCode(...b.subarray(at, at + n));
  if (text(0, 4) === 'fLaC' && b.length > 20) return (b[18] << 12) | (b[19] << 4) | (b[20] >> 4); // STREAMINFO
  if (text(0, 4) === 'OggS') {
    const at = 28; // the first page's first packet, after a one-segment header
    if (text(at, 8) === 'OpusHead') return 48000; // Opus always decodes at 48 kHz
    if (text(at + 1, 6) === 'vorbis') return new DataView(b.buffer, b.byteOffset).getUint32(at + 12, true);
  }
  let at = 0;
  if (text(0, 3) === 'ID3' && b.length > 10) at = 10 + ((b[6] << 21) | (b[7] << 14) | (b[8] << 7) | b[9]);
  if (b[at] === 0xff && (b[at + 1] & 0xe0) === 0xe0) { // an MPEG audio frame header
    const version = (b[at + 1] >> 3) & 3, index = (b[at + 2] >> 2) & 3;
    const base = [11025, 0, 22050, 44100][version];
    if (index < 3 && base) return [base, (base * 480) / 441, (base * 320) / 441][index];
  }
  return null;
}

export class MicRecorder {
  constructor() {
    /** @type {MediaStream | null} */
    this.stream = null;
    /** @type {MediaRecorder | null} */
    this.recorder = null;
    /** @type {Blob[]} */
    this.chunks = [];
  }

  async start() {
    this.stream = await openMicrophone();
    this.chunks = [];
    const recorder = (this.recorder = new MediaRecorder(this.stream));
    recorder.ondataavailable = (e) => e.data.size && this.chunks.push(e.data);
    recorder.start();
  }

  // Resolves with the recording as 16 kHz mono PCM.
  async stop() {
    const { recorder, stream } = this;
    if (!recorder || !stream) throw new Error('the microphone is not recording');
    const stopped = new Promise((resolve) => { recorder.onstop = resolve; });
    recorder.stop();
    await stopped;
    stream.getTracks().forEach((t) => t.stop()); // turns the browser's recording indicator off
    const blob = new Blob(this.chunks, { type: recorder.mimeType });
    return decodeToMono16k(await blob.arrayBuffer(), 'the recording');
  }
}

// The microphone's stream, asked for on a click; every failure one clear Error (the page shows it).
export async function openMicrophone() {
  if (!navigator.mediaDevices?.getUserMedia) {
    throw new Error('microphone access needs a secure page (https:// or http://localhost) and a browser that supports it');
  }
  try {
    // the raw signal: the model learnt unprocessed speech, and the live mode's pauses are judged on it
    return await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
    });
  } catch (e) {
    throw new Error(micMessage(e));
  }
}

/** @param {any} e getUserMedia's rejection, caught: anything may have been thrown */
function micMessage(e) {
  switch (e?.name) {
    case 'NotAllowedError':
    case 'SecurityError':
      return 'microphone permission was denied; allow it in the browser\'s site settings and try again, or choose a file instead';
    case 'NotFoundError':
    case 'OverconstrainedError':
      return 'no microphone was found; connect one, or choose a file instead';
    case 'NotReadableError':
      return 'the microphone is in use by another application or could not be started';
    default:
      return `could not start the microphone (${e?.message || e?.name})`;
  }
}

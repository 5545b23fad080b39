// Audio in the page: any file the browser can decode -> 16 kHz mono Float32Array, and
// microphone recording that starts only on a click.

export const SAMPLE_RATE = 16000;

// decodeAudioData resamples to the context's rate; channels are averaged to mono (as
// webbuild/reference/audio.py read_wav does).
export async function decodeToMono16k(arrayBuffer) {
  const ctx = new OfflineAudioContext({ numberOfChannels: 1, length: 1, sampleRate: SAMPLE_RATE });
  let audio;
  try {
    audio = await ctx.decodeAudioData(arrayBuffer);
  } catch (e) {
    throw new Error(`this file could not be decoded as audio (${e?.message || e?.name || 'unknown format'})`);
  }
  const out = new Float32Array(audio.length);
  for (let c = 0; c < audio.numberOfChannels; c++) {
    const ch = audio.getChannelData(c);
    for (let i = 0; i < out.length; i++) out[i] += ch[i] / audio.numberOfChannels;
  }
  return out;
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
    if (!navigator.mediaDevices?.getUserMedia) {
      throw new Error('microphone access needs a secure page (https:// or http://localhost) and a browser that supports it');
    }
    try {
      this.stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1, echoCancellation: false } });
    } catch (e) {
      throw new Error(micMessage(e));
    }
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
    return decodeToMono16k(await blob.arrayBuffer());
  }
}

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

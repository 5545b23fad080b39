// WAV (RIFF) to 16 kHz-or-any-rate mono Float32Array in Node: PCM 8/16/24/32-bit and float 32/64.
// The site decodes audio with the browser's AudioContext; this is the Node stand-in for clips.

/**
 * @param {Uint8Array} bytes the .wav file
 * @param {number} targetRate
 * @returns {Float32Array}
 */
export function decodeWav(bytes, targetRate) {
  const v = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  /** @param {number} at */
  const tag = (at) => String.fromCharCode(...bytes.subarray(at, at + 4));
  if (tag(0) !== 'RIFF' || tag(8) !== 'WAVE') throw new Error('not a RIFF/WAVE file');
  /** @type {{format: number, channels: number, rate: number, bits: number} | null} */
  let fmt = null;
  for (let at = 12; at + 8 <= bytes.length; at += 8 + v.getUint32(at + 4, true) + (v.getUint32(at + 4, true) & 1)) {
    const size = v.getUint32(at + 4, true);
    if (tag(at) === 'fmt ') fmt = { format: v.getUint16(at + 8, true), channels: v.getUint16(at + 10, true), rate: v.getUint32(at + 12, true), bits: v.getUint16(at + 22, true) };
    // WAVE_FORMAT_EXTENSIBLE keeps the real format in the sub-format GUID's first two bytes
    if (fmt?.format === 0xfffe && size >= 26) fmt.format = v.getUint16(at + 32, true);
    if (tag(at) === 'data' && fmt) return resample(mono(readSamples(v, at + 8, Math.min(size, bytes.length - at - 8), fmt), fmt.channels), fmt.rate, targetRate);
  }
  throw new Error('WAV has no fmt/data chunk');
}

/**
 * @param {DataView} v
 * @param {number} start
 * @param {number} size bytes
 * @param {{format: number, bits: number}} fmt
 */
function readSamples(v, start, size, { format, bits }) {
  const width = bits / 8;
  const n = Math.floor(size / width);
  const out = new Float32Array(n);
  const float = format === 3;
  for (let i = 0, at = start; i < n; i++, at += width) {
    if (float) out[i] = bits === 64 ? v.getFloat64(at, true) : v.getFloat32(at, true);
    else if (bits === 8) out[i] = (v.getUint8(at) - 128) / 128;
    else if (bits === 16) out[i] = v.getInt16(at, true) / 32768;
    else if (bits === 24) out[i] = ((v.getInt8(at + 2) << 16) | (v.getUint8(at + 1) << 8) | v.getUint8(at)) / 8388608;
    else if (bits === 32) out[i] = v.getInt32(at, true) / 2147483648;
    else throw new Error(`unsupported WAV sample width ${bits}`);
  }
  return out;
}

/**
 * @param {Float32Array} x interleaved
 * @param {number} channels
 */
function mono(x, channels) {
  if (channels === 1) return x;
  const out = new Float32Array(Math.floor(x.length / channels));
  for (let i = 0; i < out.length; i++) {
    let s = 0;
    for (let c = 0; c < channels; c++) s += x[i * channels + c];
    out[i] = s / channels;
  }
  return out;
}

// Linear interpolation: enough for a benchmark's input (the sample clips are 16 kHz already).
/**
 * @param {Float32Array} x
 * @param {number} from Hz
 * @param {number} to Hz
 */
function resample(x, from, to) {
  if (from === to) return x;
  const out = new Float32Array(Math.floor((x.length * to) / from));
  for (let i = 0; i < out.length; i++) {
    const t = (i * from) / to;
    const j = Math.floor(t);
    out[i] = x[j] + (t - j) * ((x[j + 1] ?? x[j]) - x[j]);
  }
  return out;
}

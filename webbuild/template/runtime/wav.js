// WAV bytes -> float64 mono at the file's own rate: the twin of webbuild/reference/wav.py (its docstring
// lists what is accepted and what is refused). Each refusal throws one message, the same as the Python
// reference's (minus the file name, which the page puts in front).

export const MIN_RATE = 1000, MAX_RATE = 384000;
const STREAM_SIZES = [0, 0xffffffff, 0x7ffff000]; // data sizes that mean "to the end of the file"
const PCM = 1, FLOAT = 3, EXTENSIBLE = 0xfffe;
const CUT_SHORT = 'the file was cut short: copy or export it again'; // what to do about a truncated file

export class WavError extends Error {}

// Whether the bytes start as a WAV file (else the page decodes them as another container).
/** @param {ArrayBuffer} buffer */
export function isWav(buffer) {
  const b = new Uint8Array(buffer, 0, Math.min(12, buffer.byteLength));
  const tag = (/** @type {number} */ at) => String.fromCharCode(...b.subarray(at, at + 4));
  return b.length >= 12 && tag(0) === 'RIFF' && tag(8) === 'WAVE';
}

/**
 * The header: rate, channels, encoding, bits, where the data starts and how many frames it holds.
 * @param {ArrayBuffer} buffer
 */
export function wavInfo(buffer) {
  if (!isWav(buffer)) throw new WavError('not a WAV file (no RIFF/WAVE header); convert it to WAV (PCM or float)');
  const view = new DataView(buffer);
  let pos = 12;
  /** @type {DataView | null} */
  let fmt = null;
  for (;;) {
    if (pos + 8 > buffer.byteLength) throw new WavError(fmt ? 'no data chunk' : 'no fmt chunk');
    const id = String.fromCharCode(...new Uint8Array(buffer, pos, 4));
    const size = view.getUint32(pos + 4, true);
    if (id === 'fmt ') fmt = new DataView(buffer, pos + 8, Math.min(size, 40, buffer.byteLength - pos - 8));
    else if (id === 'data') {
      if (!fmt) throw new WavError('the data chunk comes before the fmt chunk');
      return infoFrom(fmt, pos + 8, size, buffer.byteLength);
    }
    pos += 8 + size + (size & 1);
  }
}

/** @param {DataView} fmt @param {number} offset @param {number} declared @param {number} fileSize */
function infoFrom(fmt, offset, declared, fileSize) {
  if (fmt.byteLength < 16) throw new WavError(`fmt chunk of ${fmt.byteLength} bytes, expected at least 16`);
  let encoding = fmt.getUint16(0, true);
  const channels = fmt.getUint16(2, true), rate = fmt.getUint32(4, true), bits = fmt.getUint16(14, true);
  if (encoding === EXTENSIBLE && fmt.byteLength >= 26) encoding = fmt.getUint16(24, true);
  const known = (encoding === PCM && [8, 16, 24, 32].includes(bits)) || (encoding === FLOAT && [32, 64].includes(bits));
  if (!known) {
    throw new WavError(`unsupported WAV encoding (format ${encoding}, ${bits}-bit); supported: PCM 8/16/24/32-bit and float 32/64-bit`);
  }
  if (channels < 1) throw new WavError('the fmt chunk says 0 channels');
  if (rate < MIN_RATE || rate > MAX_RATE) throw new WavError(`sample rate ${rate} Hz is outside ${MIN_RATE}-${MAX_RATE} Hz`);
  const frame = (channels * bits) / 8;
  const available = fileSize - offset;
  const size = STREAM_SIZES.includes(declared) ? available : declared;
  if (size > available) throw new WavError(`truncated: the data chunk says ${declared} bytes, the file holds ${available}; ${CUT_SHORT}`);
  if (size % frame) throw new WavError(`truncated: ${size} data bytes are not a whole number of ${frame}-byte frames; ${CUT_SHORT}`);
  if (size === 0) throw new WavError('the WAV file holds no samples');
  return { rate, channels, encoding, bits, offset, frames: size / frame };
}

// The samples as float64 mono in [-1, 1] (the channels' mean, summed in channel order), in blocks of
// `blockFrames` read as they are consumed (a long file is never held whole as float64), with the rate and
// the number of frames. The header is checked at once; each block's samples as it is read.
/** @param {ArrayBuffer} buffer @param {number} [blockFrames] */
export function parseWav(buffer, blockFrames = 65536) {
  const info = wavInfo(buffer);
  return { rate: info.rate, frames: info.frames, blocks: wavBlocks(buffer, info, blockFrames) };
}

/**
 * @param {ArrayBuffer} buffer @param {ReturnType<typeof wavInfo>} info @param {number} blockFrames
 * @returns {Generator<Float64Array>}
 */
function* wavBlocks(buffer, info, blockFrames) {
  const { channels, bits, encoding, frames, rate } = info;
  const read = sampleReader(new DataView(buffer, info.offset, frames * channels * (bits / 8)), encoding, bits);
  for (let start = 0; start < frames; start += blockFrames) {
    const pcm = new Float64Array(Math.min(blockFrames, frames - start));
    for (let j = 0; j < pcm.length; j++) {
      const i = start + j;
      let sum = read(i * channels);
      for (let c = 1; c < channels; c++) sum += read(i * channels + c);
      const x = channels > 1 ? sum / channels : sum;
      if (!Number.isFinite(x)) {
        throw new WavError(`sample ${i} (${(i / rate).toFixed(2)} s) is ${Number.isNaN(x) ? 'NaN' : 'infinite'}; the file is corrupt`);
      }
      pcm[j] = x;
    }
    yield pcm;
  }
}

// Sample k (frame * channels + channel) of the data as a float64.
/** @param {DataView} v @param {number} encoding @param {number} bits @returns {(k: number) => number} */
function sampleReader(v, encoding, bits) {
  if (encoding === FLOAT) return bits === 32 ? (k) => v.getFloat32(4 * k, true) : (k) => v.getFloat64(8 * k, true);
  if (bits === 8) return (k) => (v.getUint8(k) - 128) / 128;
  if (bits === 16) return (k) => v.getInt16(2 * k, true) / 32768;
  if (bits === 24) return (k) => (((v.getUint8(3 * k + 2) << 24) | (v.getUint8(3 * k + 1) << 16) | (v.getUint8(3 * k) << 8)) >> 8) / 8388608;
  return (k) => v.getInt32(4 * k, true) / 2147483648;
}

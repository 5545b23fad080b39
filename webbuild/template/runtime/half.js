// IEEE half floats (float16) as onnxruntime-web hands them over: raw bits in a Uint16Array.

// float32 -> IEEE half bits, rounding to nearest even (as numpy's astype(float16) does).
const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** @param {number} value */
export function floatToHalf(value) {
  f32[0] = value;
  const x = u32[0];
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  const mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0); // Inf, NaN
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00; // overflow: Inf
  if (e <= 0) { // subnormal half (or zero)
    if (e < -10) return sign;
    const m = mant | 0x800000;
    const shift = 14 - e;
    return sign | roundShift(m, shift);
  }
  return sign | ((e << 10) + roundShift(mant, 13)); // a carry out of the mantissa bumps the exponent: right
}

// m >> shift, rounded to nearest, ties to even.
/** @param {number} m @param {number} shift */
function roundShift(m, shift) {
  const kept = m >>> shift;
  const rest = m - (kept << shift);
  const half = 1 << (shift - 1);
  return kept + (rest > half || (rest === half && (kept & 1)) ? 1 : 0);
}

/** @param {ArrayLike<number>} values */
export function floatsToHalfs(values) {
  const out = new Uint16Array(values.length);
  for (let i = 0; i < values.length; i++) out[i] = floatToHalf(values[i]);
  return out;
}

/** @param {ArrayLike<number>} bits half floats' bits */
export function halfsToFloats(bits) {
  const out = new Float32Array(bits.length);
  for (let i = 0; i < bits.length; i++) out[i] = halfToFloat(bits[i]);
  return out;
}

/** @param {number} h */
function halfToFloat(h) {
  const exp = (h >> 10) & 0x1f;
  const frac = h & 0x3ff;
  const sign = h & 0x8000 ? -1 : 1;
  if (exp === 0) return sign * 2 ** -14 * (frac / 1024);
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return sign * 2 ** (exp - 15) * (1 + frac / 1024);
}

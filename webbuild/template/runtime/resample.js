// The project's one resampler, the twin of webbuild/reference/resample.py (its docstring has the design):
// windowed-sinc interpolation at the exact ratio L/M, a Kaiser window, float64 throughout. The page, the
// microphone and the Python reference give the same 16 kHz samples (tests/test_resample.py compares them).
// `Resampler` takes blocks and keeps its state across them: its output does not depend on how the input
// was cut, so a live microphone's frames resample as a whole file does.

export const ZEROS = 32; // sinc zero crossings each side of the centre
export const CUTOFF = 0.92; // the cutoff as a fraction of the lower of the two Nyquist frequencies
export const BETA = 9.0; // Kaiser window: about 90 dB of stopband

/** @param {number} a @param {number} b */
function gcd(a, b) {
  while (b) [a, b] = [b, a % b];
  return a;
}

// I0 by its power series, term for term as resample.py's bessel_i0
/** @param {number} x */
function besselI0(x) {
  let total = 1, term = 1;
  const half = x / 2;
  for (let k = 1; k < 64; k++) {
    term *= (half / k) ** 2;
    total += term;
  }
  return total;
}

export class Design {
  /** @param {number} rateIn @param {number} rateOut */
  constructor(rateIn, rateOut) {
    const g = gcd(rateIn, rateOut);
    this.up = rateOut / g;
    this.down = rateIn / g;
    this.fc = 0.5 * CUTOFF * Math.min(1, this.up / this.down);
    this.half = ZEROS / (2 * this.fc); // the window's half width, in input samples
    this.reach = Math.ceil(this.half);
    this.norm = besselI0(BETA);
    /** @type {Map<number, Float64Array>} */
    this.phases = new Map();
  }

  // Weights of input samples floor(t) - reach + 1 ... floor(t) + reach for an output at fraction phase / up.
  /** @param {number} phase */
  taps(phase) {
    let taps = this.phases.get(phase);
    if (!taps) {
      taps = new Float64Array(2 * this.reach);
      const frac = phase / this.up;
      for (let j = 0; j < taps.length; j++) taps[j] = this.kernel(frac - (j - this.reach + 1));
      this.phases.set(phase, taps);
    }
    return taps;
  }

  /** @param {number} x */
  kernel(x) {
    if (Math.abs(x) > this.half) return 0;
    const arg = 2 * this.fc * x;
    const sinc = arg === 0 ? 1 : Math.sin(Math.PI * arg) / (Math.PI * arg);
    const inside = Math.max(0, 1 - (x / this.half) ** 2);
    return 2 * this.fc * sinc * (besselI0(BETA * Math.sqrt(inside)) / this.norm);
  }
}

export class Resampler {
  /** @param {number} rateIn @param {number} [rateOut] */
  constructor(rateIn, rateOut = 16000) {
    this.d = new Design(rateIn, rateOut);
    this.identity = this.d.up === this.d.down;
    this.buf = new Float64Array(this.d.reach); // the zeros before the first sample
    this.base = -this.d.reach; // input index of buf[0]
    this.seen = 0; // input samples pushed
    this.made = 0; // output samples returned
  }

  // The outputs whose windows the input so far covers.
  /** @param {ArrayLike<number>} block @returns {Float64Array} */
  push(block) {
    this.seen += block.length;
    if (this.identity) return Float64Array.from(block);
    this.append(block);
    const { up, down, reach } = this.d;
    return this.emit(ceilDiv((this.seen - reach) * up, down));
  }

  // The rest, the input taken to be zeros past its end: ceil(N * L / M) outputs in all.
  /** @returns {Float64Array} */
  finish() {
    if (this.identity) return new Float64Array(0);
    this.append(new Float64Array(2 * this.d.reach + 1));
    return this.emit(ceilDiv(this.seen * this.d.up, this.d.down));
  }

  /** @param {ArrayLike<number>} block */
  append(block) {
    const buf = new Float64Array(this.buf.length + block.length);
    buf.set(this.buf);
    for (let i = 0; i < block.length; i++) buf[this.buf.length + i] = block[i];
    this.buf = buf;
  }

  /** @param {number} upto */
  emit(upto) {
    const { up, down, reach } = this.d;
    const out = new Float64Array(Math.max(0, upto - this.made));
    for (let i = 0; i < out.length; i++) {
      const n = this.made + i;
      const pos = Math.floor((n * down) / up);
      const taps = this.d.taps(n * down - pos * up);
      const first = pos - reach + 1 - this.base;
      let sum = 0;
      for (let j = 0; j < taps.length; j++) sum += this.buf[first + j] * taps[j];
      out[i] = sum;
    }
    this.made += out.length;
    const cut = Math.floor((this.made * down) / up) - reach + 1 - this.base; // input no later output reaches
    if (cut > 0) {
      this.buf = this.buf.slice(cut);
      this.base += cut;
    }
    return out;
  }
}

/** @param {number} a @param {number} b */
function ceilDiv(a, b) {
  return Math.ceil(a / b);
}

// The whole of `pcm` at rateIn as rateOut (float64).
/** @param {ArrayLike<number>} pcm @param {number} rateIn @param {number} [rateOut] */
export function resample(pcm, rateIn, rateOut = 16000) {
  const r = new Resampler(rateIn, rateOut);
  const a = r.push(pcm), b = r.finish();
  const out = new Float64Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

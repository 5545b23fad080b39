// Each kind of the adapted step form's lora inputs, made from an adapter's tensors as its layout record says (the
// manifest variant's `lora_layout`: webbuild/forms/lora.py step_layout, docs/adapters.md "The step
// layout"), bit for bit as webbuild/site/adapter_pack.py step_inputs makes them. A record names its input's kind,
// part (codes, scales or values), dims, bits, block and the adapter tensors it is made from (`from`); nothing here
// reads an input's name.

import { floatsToHalfs } from './half.js';
import { BLOCK, ZERO_POINT } from './lora-file.js';

/** @typedef {import('webbuild-types').LoraInput} LoraInput  a layout record */
/** @typedef {Record<string, LoraInput>} LoraLayout  the manifest variant's lora_layout, by step input */
/** @typedef {Float32Array<ArrayBuffer> | Uint16Array<ArrayBuffer> | Uint8Array<ArrayBuffer>} LoraValue */
/** @typedef {Record<string, LoraValue>} LoraValues  input name -> values: [K * N] row-major, or codes or scales */
/** @typedef {{codes?: Uint8Array<ArrayBuffer>, scales?: Float32Array<ArrayBuffer>, values?: Float32Array<ArrayBuffer>}} Parts */
/** @typedef {(r: LoraInput, sources: (Float32Array | null)[], shapes: number[][]) => Parts} Encoder */

const IDENTITY_CODE = 64; // an 8-bit identity's ones: code 128 + 64 at scale 1/64 (adapter_pack.py IDENTITY_CODE)

// The step inputs the page makes from an adapter's float32 values (`f32`, by tensor; `shapes`: their [K, N]) at a
// switch: codes uint8, scales and values in the graph's float type. A joint_down's is its rows after `rows` only
// (the base rows before them were written at load: lora-inputs.js). Left out: the `float` kind (the adapted graph's
// own tensor) and `delta` (the delta graph makes it on the GPU: lora-delta.js).
/**
 * @param {Record<string, Float32Array>} f32
 * @param {Record<string, number[]>} shapes
 * @param {LoraLayout} layout
 * @param {'float16' | 'float32'} dtype
 * @returns {LoraValues}
 */
export function stepValues(f32, shapes, layout, dtype) {
  /** @type {Record<string, Parts>} */
  const made = {};
  /** @type {LoraValues} */
  const out = {};
  for (const [name, r] of Object.entries(layout)) {
    const encode = ENCODERS[r.kind];
    if (!encode) continue;
    const key = `${r.kind} ${r.from.join(' ')}`;
    made[key] ??= encode(r, r.from.map((n) => f32[n] ?? null), r.from.map((n) => shapes[n] ?? [0, 0]));
    out[name] = inType(/** @type {Uint8Array<ArrayBuffer> | Float32Array<ArrayBuffer>} */ (made[key][r.part]), r.part, dtype);
  }
  return out;
}

// The sources a record's kind reads as float32 (lora.js loraValues reads those once as float32).
/** @param {LoraLayout} layout */
export function encodedSources(layout) {
  return new Set(Object.values(layout).filter((r) => ENCODERS[r.kind]).flatMap((r) => r.from));
}

// What a step input holds before any adapter (adapter_pack.py step_inputs of no adapter), where that is not zeros:
// zero codes (the zero point), a joint's base rows (`base`: bytes of the weights file, read by `file`) and a joint
// up's identity. null: zeros.
/**
 * @param {LoraInput} r
 * @param {'float16' | 'float32'} dtype
 * @param {(name: string) => Uint8Array | undefined} file
 * @returns {LoraValue | null}
 */
export function startValue(r, dtype, file) {
  if (r.kind === 'joint_up') return inType(/** @type {any} */ (jointUp(r, [null], [[0, 0]])[r.part]), r.part, dtype);
  if (r.kind === 'joint_down') return jointStart(r, dtype, file);
  return r.part === 'codes' ? zeroCodes(r.dims, /** @type {number} */ (r.bits)) : null;
}

// Where a step input's values go in its buffer, in bytes: a joint_down's after its base rows, 0 otherwise.
/**
 * @param {LoraInput} r
 * @param {LoraValue} data
 */
export function stepOffset(r, data) {
  const rows = r.rows ?? 0;
  return r.kind === 'joint_down' ? (data.byteLength / (r.dims[0] - rows)) * rows : 0;
}

/**
 * @param {Uint8Array<ArrayBuffer> | Float32Array<ArrayBuffer>} data
 * @param {LoraInput['part']} part
 * @param {'float16' | 'float32'} dtype
 * @returns {LoraValue}
 */
function inType(data, part, dtype) {
  return part !== 'codes' && dtype === 'float16' ? floatsToHalfs(/** @type {Float32Array} */ (data)) : data;
}

// `source` [k, n] (null: nothing) in the top left of zeros [rows, cols], row-major.
/**
 * @param {Float32Array | null} source
 * @param {number[]} shape
 * @param {number} rows
 * @param {number} cols
 */
function padded(source, [k, n], rows, cols) {
  const out = new Float32Array(rows * cols);
  for (let i = 0; i < k && source; i++) out.set(source.subarray(i * n, (i + 1) * n), i * cols);
  return out;
}

/**
 * @param {LoraInput} r
 * @param {Float32Array} w
 * @param {number} rows
 * @param {number} cols
 * @returns {Parts}
 */
function blocksOf(r, w, rows, cols) {
  return quantizeBlocks(w, [rows, cols], /** @type {number} */ (r.bits), /** @type {number} */ (r.block));
}

/** @type {Encoder} a down [in, r] in MatMulNBits blocks, its columns padded to the record's R (dims [R, blocks, ...]) */
function down(r, [source], [shape]) {
  const [rank, blocks] = r.dims, k = blocks * /** @type {number} */ (r.block);
  return blocksOf(r, padded(source, shape, k, rank), k, rank);
}

/** @type {Encoder} a down as a joint's rows after `rows` (the projection's own rows before them: jointStart) */
function jointDown(r, [source], [shape]) {
  const [total, blocks] = r.dims, k = blocks * /** @type {number} */ (r.block), rank = total - (r.rows ?? 0);
  return blocksOf(r, padded(source, shape, k, rank), k, rank);
}

/** @type {Encoder} ups [R, out] side by side */
function packedUp(r, sources, shapes) {
  const [rank, total] = r.dims;
  const out = new Float32Array(rank * total);
  if (sources.some((s) => !s)) return { values: out };
  for (let row = 0, at = 0; row < rank; row++) {
    sources.forEach((s, i) => { const n = shapes[i][1]; out.set(/** @type {Float32Array} */ (s).subarray(row * n, (row + 1) * n), at); at += n; });
  }
  return { values: out };
}

/** @type {Encoder} an up [R, out] as 8-bit weights [rows + rank, out]: an identity over `rows` rows (code 192 at
 *  scale 1/64, exactly 1), the up's codes and scales below it */
function jointUp(r, [source], shapes) {
  const [n, blocks] = r.dims, rows = r.rows ?? 0, eye = rows / BLOCK, rank = (blocks - eye) * BLOCK, own = rank / BLOCK;
  const up = quantizeBlocks(padded(source, shapes[0], rank, n), [rank, n], 8, BLOCK);
  const k = blocks * BLOCK;
  const codes = new Uint8Array(n * k).fill(ZERO_POINT);
  const scales = new Float32Array(n * blocks);
  for (let col = 0; col < n; col++) {
    codes[col * k + col] = ZERO_POINT + IDENTITY_CODE;
    scales.fill(1 / IDENTITY_CODE, col * blocks, col * blocks + eye);
    codes.set(up.codes.subarray(col * rank, (col + 1) * rank), col * k + rows);
    scales.set(up.scales.subarray(col * own, (col + 1) * own), col * blocks + eye);
  }
  return { codes, scales };
}

/** @type {Record<string, Encoder>} the kinds the page encodes, by the record's kind */
const ENCODERS = { down, joint_down: jointDown, packed_up: packedUp, joint_up: jointUp };

// A joint's whole input before any adapter: the projection's own bytes from the weights file (`base`), then zero
// codes or scales.
/**
 * @param {LoraInput} r
 * @param {'float16' | 'float32'} dtype
 * @param {(name: string) => Uint8Array | undefined} file
 */
function jointStart(r, dtype, file) {
  const { location, offset, length } = /** @type {NonNullable<LoraInput['base']>} */ (r.base);
  const codes = r.part === 'codes';
  const size = r.dims.reduce((a, b) => a * b) * (codes ? 1 : dtype === 'float16' ? 2 : 4);
  const weights = file(location);
  if (length > size || length % (size / r.dims[0])) throw new Error(`manifest lora_layout ${r.from.join(', ')}: ${length} bytes of base ${r.part} in ${size}; rebuild the site`);
  if (!weights || weights.length < offset + length) throw new Error(`adapted step input of ${r.from.join(', ')}: the weights file ${location} is not loaded or too short`);
  const all = new Uint8Array(size).fill(codes ? zeroCodeByte(/** @type {number} */ (r.bits)) : 0);
  all.set(weights.subarray(offset, offset + length));
  return all;
}

// A [K, N] matrix (float32, row-major) in MatMulNBits' symmetric layout of `bits` (8 or 4) and `block`
// (adapter_pack.py quantize_blocks): codes [N, blocks, block * bits / 8] (scale: the block's largest magnitude /
// 127, or / 7; code: the value / scale rounded half to even, + 128, or + 8, 4-bit codes two to a byte, the lower
// nibble first), float32 scales [N, blocks]; float32 arithmetic throughout (Math.fround of a float64 quotient of
// float32s is the float32 quotient).
/**
 * @param {Float32Array} w
 * @param {number[]} shape
 * @param {number} bits
 * @param {number} block
 */
export function quantizeBlocks(w, [k, n], bits, block) {
  const blocks = Math.ceil(k / block), top = 2 ** (bits - 1) - 1;
  const values = new Uint8Array(n * blocks * block).fill(top + 1);
  const scales = new Float32Array(n * blocks);
  for (let col = 0; col < n; col++) {
    for (let b = 0; b < blocks; b++) {
      const end = Math.min(k, (b + 1) * block);
      let max = 0;
      for (let i = b * block; i < end; i++) max = Math.max(max, Math.abs(w[i * n + col]));
      const scale = scales[col * blocks + b] = Math.fround(max / top);
      const safe = scale > 0 ? scale : 1;
      for (let i = b * block; i < end; i++) {
        const q = roundHalfEven(Math.fround(w[i * n + col] / safe));
        values[col * blocks * block + i] = Math.min(top, Math.max(-top, q)) + top + 1;
      }
    }
  }
  return { codes: bits === 4 ? nibbles(values) : values, scales };
}

/** @param {number} x */
function roundHalfEven(x) {
  const r = Math.round(x); // half up
  return r - x === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

// 4-bit codes (one a byte) two to a byte, the lower nibble first: MatMulNBits' 4-bit layout.
/** @param {Uint8Array} codes */
function nibbles(codes) {
  const out = new Uint8Array(codes.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = codes[2 * i] | (codes[2 * i + 1] << 4);
  return out;
}

// A byte of zero-point codes in `bits` 8 or 4 (two codes a byte): what a weight of zero is stored as.
/** @param {number} bits */
function zeroCodeByte(bits) {
  const zero = 2 ** (bits - 1);
  return bits === 4 ? zero | (zero << 4) : zero;
}

// Codes of zero (the zero point in every code) of `bits` 8 or 4 for a codes input of `dims`.
/**
 * @param {readonly number[]} dims
 * @param {number} bits
 */
function zeroCodes(dims, bits) {
  return new Uint8Array(dims.reduce((x, y) => x * y)).fill(zeroCodeByte(bits));
}

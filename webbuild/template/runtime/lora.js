// LoRA adapters (docs/adapters.md): the manifest's top-level `adapters`, one file per adapter
// (`adapter.<name>.bin`), turned into the adapted decoder graphs' `lora.{i}.{proj}.down|up` inputs.
//
// The adapted sessions (asr.js) read the adapter through input tensors made once, at load:
// - WebGPU: one GPU buffer per input, zero-filled (an adapter of zeros is the base model) and kept for
//   the page's life. Graph capture (capture.js) replays with the buffers it recorded, so a switch may
//   only write new values into them (`device.queue.writeBuffer`): switching allocates no GPU buffer and,
//   the adapted graphs having been warmed up on the zeros, compiles no shader.
// - wasm: CPU tensors, replaced at each switch.
// Every adapter of a build has the same inputs and shapes (the base's projections at rank 32, the downs of
// q/k/v and gate/up shared: webbuild/adapters.py DOWN_GROUPS), so one set of tensors serves them all. A file
// stores an input's rows from `rows` [start, stop) on (an up's own rows of its group's rank), the rest zeros.
// The adapted step form (the captured decode step) reads each down in MatMulNBits' 8-bit layout instead
// (`.down_codes`, `.down_scales`: webbuild/pipeline/lora_form.py quantized_downs), 4-bit for the groups whose down rides
// in a norm's fused kernel (runtime.json `lora_down_bits`: q/k/v's and gate/up's), quantized here from the down's values as webbuild/site/adapter_pack.py
// step_downs does, bit for bit, and q, k and v's ups as one input, side by side (lora_form.py packed_updates,
// adapter_pack.py packed_ups). o's and down's groups are joined to their projections there (lora_form.py
// joint_downs, the manifest variant's `lora_joint`): `.joint_codes` / `.joint_scales` hold the projection's
// weights, copied from the decoder's weights file at load, then the down's rows in the projection's bits, and
// `.up_codes` / `.up_scales` an 8-bit identity over the projection's part with the up below it (adapter_pack.py
// joint_inputs, bit for bit). Gate's and up's updates are merged there (lora_form.py merged_deltas, runtime.json
// `lora_delta_groups`): `.delta_codes` / `.delta_scales` hold down @ up in 4-bit blocks, which the build's delta
// graph (webbuild/pipeline/lora_delta.py) computes on the GPU at each switch, from the adapted graph's down and ups
// straight into the step's buffers (adapter_pack.py delta_inputs, up to the order of the product's sums).

import { floatsToHalfs, halfsToFloats } from './half.js';
import { loadFiles } from './loader.js';

/** @typedef {import('webbuild-types').Ort} Ort */
/** @typedef {import('webbuild-types').OrtTensor} OrtTensor */
/** @typedef {import('webbuild-types').Manifest} Manifest */
/** @typedef {NonNullable<Manifest['adapters']>[string]} Adapter  a manifest `adapters` entry */
/** @typedef {Adapter['tensors'][string]} AdapterTensor */
/** @typedef {import('webbuild-types').LoraJoint} LoraJoint  a joined group: manifest variant `lora_joint` */
/** @typedef {Record<string, LoraJoint>} JointTable  by `lora.{i}.{group}` */
/** @typedef {Record<string, Float32Array<ArrayBuffer> | Uint16Array<ArrayBuffer> | Uint8Array<ArrayBuffer>>} LoraValues
 *  input name -> values: [K * N] row-major, or a step input's codes or scales (stepDowns) */

const BLOCK = 32; // MatMulNBits' blocks along K
const ZERO_POINT = 128; // int8's
const DOWN = /\.down$/; // a group's down input; its step form's inputs end in CODES and SCALES instead
const CODES = '.down_codes', SCALES = '.down_scales'; // webbuild/site/contract.py DOWN_CODES, DOWN_SCALES
// contract.py JOINT_CODES, JOINT_SCALES, UP_CODES, UP_SCALES: a joined group's inputs (lora_form.py joint_downs)
const JOINT = { codes: '.joint_codes', scales: '.joint_scales', upCodes: '.up_codes', upScales: '.up_scales' };
const IDENTITY_CODE = 64; // an 8-bit identity's ones: code 128 + 64 at scale 1/64 (adapter_pack.py IDENTITY_CODE)
// contract.py DELTA_CODES, DELTA_SCALES, DELTA_BITS: a merged update's inputs (lora_form.py merged_deltas)
const DELTA = { codes: '.delta_codes', scales: '.delta_scales', bits: 4 };
const MERGED = /^(.*\.)([^.]+)\.delta_(codes|scales)$/; // the layer's prefix (`lora.{i}.`), projection, factor

// The adapters a build ships, by name (the page's picker), in the manifest's order.
/** @param {Manifest | null | undefined} manifest */
export function loraNames(manifest) {
  return Object.keys(manifest?.adapters ?? {});
}

// What each adapter is for, by name (model.yaml's `description`; adapters without one are left out).
/** @param {Manifest | null | undefined} manifest */
export function loraAbout(manifest) {
  /** @type {Record<string, string>} */
  const about = {};
  for (const [name, entry] of Object.entries(manifest?.adapters ?? {})) if (entry.description) about[name] = entry.description;
  return about;
}

// {input name: [K, N]} shared by every adapter of the build (null without adapters).
/**
 * @param {Manifest | null | undefined} manifest
 * @returns {Record<string, number[]> | null}
 */
export function loraShapes(manifest) {
  const first = Object.values(manifest?.adapters ?? {})[0];
  return first ? Object.fromEntries(Object.entries(first.tensors).map(([name, t]) => [name, t.shape])) : null;
}

// One adapter's file, through the loader: its own shards only, verified and cached like the model's.
/**
 * @param {import('./loader.js').LoadedManifest} manifest
 * @param {string} name
 * @param {import('./loader.js').LoadOptions} [loading]
 */
export async function loadLoraFile(manifest, name, loading = {}) {
  const entry = manifest.adapters?.[name];
  if (!entry) throw new Error(`no adapter ${JSON.stringify(name)}; the build has ${loraNames(manifest).join(', ') || 'none'}`);
  const files = await loadFiles(manifest, [entry.file], loading);
  return { entry, bytes: /** @type {Uint8Array} */ (files.get(entry.file)) };
}

// Switches a loaded site (site.js loadSite) to adapter `name`, or back to the base model (null): the
// next transcription runs with it. loading: the loader's options (site.loading, with its progress
// callbacks). Returns the name now on, or null.
/**
 * @param {{recogniser: import('./asr.js').Recogniser, manifest: import('./loader.js').LoadedManifest,
 *   loading: import('./loader.js').LoadOptions}} site
 * @param {string | null} name
 * @param {import('./loader.js').LoadOptions} [loading]
 */
export async function switchLora(site, name, loading = site.loading) {
  if (!name) {
    await site.recogniser.setLora(null);
    return null;
  }
  const { entry, bytes } = await loadLoraFile(site.manifest, name, loading);
  const { recogniser } = site;
  await recogniser.setLora(loraValues(bytes, entry, recogniser.dtype, recogniser.rt.lora_down_bits, recogniser.loraJoint),
    loraRows(entry));
  return name;
}

// {input name: [start, stop)}: the rows of each input an adapter's file stores, the others being zeros.
/**
 * @param {Adapter} entry
 * @returns {Record<string, number[]>}
 */
export function loraRows(entry) {
  return Object.fromEntries(Object.entries(entry.tensors).map(([name, t]) => [name, t.rows ?? [0, t.shape[0]]]));
}

// {input name: typed array [K * N], row-major} of an adapter file in the graph's float type: Float32Array
// for 'float32', float16 bits (Uint16Array, as onnxruntime-web takes float16 data) for 'float16'; and the
// step form's codes and scales of each down (stepDowns), in the bits `bits` gives its group (runtime.json
// lora_down_bits; 8 for a group it leaves out), or, for a group of `joint` (the manifest variant's lora_joint), its
// down's rows of the joint weights and its up's 8-bit weights (jointValues).
/**
 * @param {Uint8Array} bytes the adapter file
 * @param {Adapter} entry
 * @param {'float16' | 'float32'} [dtype]
 * @param {Record<string, number>} [bits]
 * @param {JointTable} [joint]
 */
export function loraValues(bytes, entry, dtype = 'float32', bits = {}, joint = {}) {
  /** @type {LoraValues} */
  const out = {};
  for (const [name, t] of Object.entries(entry.tensors)) {
    const group = joint[name.replace(/\.(down|up)$/, '')];
    if (!DOWN.test(name) && !group) {
      out[name] = tensorValues(bytes, entry.precision, t, dtype);
      continue;
    }
    // read once as float32: the step form's codes come from it, and a float16 graph's values too
    const f32 = /** @type {Float32Array<ArrayBuffer>} */ (tensorValues(bytes, entry.precision, t, 'float32'));
    out[name] = dtype === 'float16' ? floatsToHalfs(f32) : f32;
    Object.assign(out, group ? jointValues(name, f32, group, dtype)
      : stepDowns(name, f32, t.shape, dtype, downBits(name, bits)));
  }
  return out;
}

// A joined group's down ([in, R] float32) or up ([R, out]) as the adapted step form reads it (adapter_pack.py
// joint_down, joint_up): the down's rows of `.joint_codes` and `.joint_scales` (its last `rank` rows, in the
// projection's bits and blocks, zero columns after R), or the whole `.up_codes` and `.up_scales` of its projection;
// scales in the graph's float type. null values: no adapter.
/**
 * @param {string} name `lora.{i}.{group}.down` or `lora.{i}.{proj}.up`
 * @param {Float32Array | null} values
 * @param {LoraJoint} e
 * @param {'float16' | 'float32'} dtype
 * @returns {LoraValues}
 */
export function jointValues(name, values, e, dtype) {
  const half = (/** @type {Float32Array<ArrayBuffer>} */ f) => (dtype === 'float16' ? floatsToHalfs(f) : f);
  if (DOWN.test(name)) {
    const padded = new Float32Array(e.in * e.rank);
    const r = values ? values.length / e.in : 0;
    for (let i = 0; i < e.in && values; i++) padded.set(values.subarray(i * r, (i + 1) * r), i * e.rank);
    const { codes, scales } = quantizeBlocks(padded, [e.in, e.rank], e.bits, e.block);
    const key = name.replace(DOWN, '');
    return { [key + JOINT.codes]: codes, [key + JOINT.scales]: half(scales) };
  }
  const padded = new Float32Array(e.rank * e.out);
  if (values) padded.set(values);
  const b = quantizeBlocks(padded, [e.rank, e.out], 8, BLOCK);
  const k = e.rows + e.rank, eye = e.rows / BLOCK, blocks = k / BLOCK, own = e.rank / BLOCK;
  const codes = new Uint8Array(e.out * k).fill(ZERO_POINT);
  const scales = new Float32Array(e.out * blocks);
  for (let n = 0; n < e.out; n++) {
    codes[n * k + n] = ZERO_POINT + IDENTITY_CODE;
    scales.fill(1 / IDENTITY_CODE, n * blocks, n * blocks + eye);
    codes.set(b.codes.subarray(n * e.rank, (n + 1) * e.rank), n * k + e.rows);
    scales.set(b.scales.subarray(n * own, (n + 1) * own), n * blocks + eye);
  }
  const key = name.replace(/\.up$/, '');
  return { [key + JOINT.upCodes]: codes, [key + JOINT.upScales]: half(scales) };
}

// {input: [dims]} of a joined group's step inputs, by its `lora.{i}.{group}` key (lora_form.py joint_downs).
/**
 * @param {string} key
 * @param {LoraJoint} e
 */
function jointShapes(key, e) {
  const total = e.rows + e.rank;
  return {
    [key + JOINT.codes]: [total, e.blocks, (e.block * e.bits) / 8], [key + JOINT.scales]: [total, e.blocks],
    [key + JOINT.upCodes]: [e.out, total / BLOCK, BLOCK], [key + JOINT.upScales]: [e.out, total / BLOCK],
  };
}

// The bits of a down's codes in the step form (adapter_pack.py down_bits): runtime.json's lora_down_bits for its
// group, 8 where it has none.
/**
 * @param {string} name a down input, `lora.{i}.{group}.down`, or one of its step inputs
 * @param {Record<string, number>} bits
 */
function downBits(name, bits) {
  return bits[name.split('.')[2]] ?? 8;
}

// {input: [dims]} of the step form's down inputs, for a down `name` of [K, N]: codes [N, blocks, 32 * bits / 8],
// scales [N, blocks].
/**
 * @param {string} name
 * @param {number[]} shape
 * @param {number} bits
 */
function stepShapes(name, [k, n], bits) {
  const blocks = Math.ceil(k / BLOCK);
  return { [name.replace(DOWN, CODES)]: [n, blocks, (BLOCK * bits) / 8], [name.replace(DOWN, SCALES)]: [n, blocks] };
}

// A down's values ([K, N] float32, row-major) as the adapted step form reads them: MatMulNBits' symmetric blocks
// of `bits` 8 or 4, as adapter_pack.py quantize_blocks makes them (scale: the block's largest magnitude / 127, or
// / 7; code: the value / scale rounded half to even, + 128, or + 8, 4-bit codes two to a byte, the lower nibble
// first), float32 arithmetic throughout (Math.fround of a float64 quotient of float32s is the float32 quotient);
// scales in the graph's float type.
/**
 * @param {string} name
 * @param {Float32Array} down
 * @param {number[]} shape
 * @param {'float16' | 'float32'} dtype
 * @param {number} [bits]
 * @returns {LoraValues}
 */
export function stepDowns(name, down, [k, n], dtype, bits = 8) {
  const { codes, scales } = quantizeBlocks(down, [k, n], bits, BLOCK);
  const [codesName, scalesName] = Object.keys(stepShapes(name, [k, n], bits));
  return { [codesName]: codes, [scalesName]: dtype === 'float16' ? floatsToHalfs(scales) : scales };
}

// A [K, N] matrix (float32, row-major) in MatMulNBits' symmetric layout of `bits` and `block` (adapter_pack.py
// quantize_blocks): codes [N, blocks, block * bits / 8], float32 scales [N, blocks].
/**
 * @param {Float32Array} w
 * @param {number[]} shape
 * @param {number} bits
 * @param {number} block
 */
function quantizeBlocks(w, [k, n], bits, block) {
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

// 4-bit codes (one a byte) two to a byte, the lower nibble first: MatMulNBits' 4-bit layout.
/** @param {Uint8Array} codes */
function nibbles(codes) {
  const out = new Uint8Array(codes.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = codes[2 * i] | (codes[2 * i + 1] << 4);
  return out;
}

// Matrices of `rank` rows and `widths` columns (row-major) side by side: one [rank, sum of widths].
/**
 * @param {(LoraValues[string] | undefined)[]} parts
 * @param {number} rank
 * @param {number[]} widths
 * @returns {LoraValues[string] | undefined}
 */
export function sideBySide(parts, rank, widths) {
  const first = parts[0];
  if (!first || parts.some((p, i) => !p || p.length !== rank * widths[i])) return undefined;
  const total = widths.reduce((a, b) => a + b);
  const out = new /** @type {any} */ (first.constructor)(rank * total);
  for (let r = 0, at = 0; r < rank; r++) {
    parts.forEach((p, i) => { out.set(/** @type {LoraValues[string]} */ (p).subarray(r * widths[i], (r + 1) * widths[i]), at); at += widths[i]; });
  }
  return out;
}

/** @param {number} x */
function roundHalfEven(x) {
  const r = Math.round(x); // half up
  return r - x === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/**
 * @param {Uint8Array} bytes
 * @param {Adapter['precision']} precision
 * @param {AdapterTensor} t
 * @param {'float16' | 'float32'} dtype
 * @returns {Float32Array<ArrayBuffer> | Uint16Array<ArrayBuffer>}
 */
function tensorValues(bytes, precision, t, dtype) {
  const [k, n] = t.shape;
  const [start, stop] = t.rows ?? [0, k]; // the stored rows; the others are zeros
  const stored = { ...t, shape: [stop - start, n] };
  const band = storedValues(bytes, precision, stored, dtype);
  if (stop - start === k) return band;
  const full = dtype === 'float16' ? new Uint16Array(k * n) : new Float32Array(k * n); // half 0 is bits 0
  full.set(band, start * n);
  return full;
}

/**
 * @param {Uint8Array} bytes
 * @param {Adapter['precision']} precision
 * @param {AdapterTensor} t the stored rows' [K, N]
 * @param {'float16' | 'float32'} dtype
 * @returns {Float32Array<ArrayBuffer> | Uint16Array<ArrayBuffer>}
 */
function storedValues(bytes, precision, t, dtype) {
  const [k, n] = t.shape;
  if (precision === 'fp16' && dtype === 'float16') return view(bytes, Uint16Array, t.offset, k * n).slice();
  const f32 = precision === 'int8' ? dequantizeInt8(bytes, t)
    : precision === 'fp16' ? halfsToFloats(view(bytes, Uint16Array, t.offset, k * n))
      : precision === 'fp32' ? view(bytes, Float32Array, t.offset, k * n).slice()
        : unknownPrecision(precision);
  return dtype === 'float16' ? floatsToHalfs(f32) : f32;
}

/**
 * @param {string} precision
 * @returns {never}
 */
function unknownPrecision(precision) {
  throw new Error(`adapter precision ${JSON.stringify(precision)}: this runtime reads int8, fp16 and fp32`);
}

// MatMulNBits' 8-bit layout of a [K, N] matrix: codes [N][ceil(K / 32) * 32] (column n of the matrix in
// K order, K padded), zero point 128, float32 scales [N][ceil(K / 32)]. Element [k, n] is
// (q[n][k] - 128) * scale[n][floor(k / 32)]; returned row-major [K, N], as the graph input is.
/**
 * @param {Uint8Array} bytes
 * @param {AdapterTensor} t
 */
export function dequantizeInt8(bytes, { shape: [k, n], offset, scales_offset: scalesOffset }) {
  const blocks = Math.ceil(k / BLOCK);
  const codes = view(bytes, Uint8Array, offset, n * blocks * BLOCK);
  // an int8 tensor has its scales (the build writes scales_offset for int8 only)
  const scales = view(bytes, Float32Array, /** @type {number} */ (scalesOffset), n * blocks);
  const out = new Float32Array(k * n);
  for (let col = 0; col < n; col++) {
    const row = col * blocks * BLOCK;
    for (let i = 0; i < k; i++) out[i * n + col] = (codes[row + i] - ZERO_POINT) * scales[col * blocks + (i >> 5)];
  }
  return out;
}

// A typed view of `count` elements at byte `offset` of `bytes` (a Uint8Array); a copy where the offset
// does not fall on the element size (the file's offsets are multiples of 4, the array may not start on one).
/**
 * @template {Uint8Array | Uint16Array | Float32Array} T
 * @param {Uint8Array} bytes
 * @param {{new (buffer: ArrayBufferLike, byteOffset?: number, length?: number): T, BYTES_PER_ELEMENT: number, name: string}} Type
 * @param {number} offset
 * @param {number} count
 * @returns {T}
 */
function view(bytes, Type, offset, count) {
  const at = bytes.byteOffset + offset;
  if (offset + count * Type.BYTES_PER_ELEMENT > bytes.byteLength) throw new Error(`adapter file: ${Type.name} at ${offset} runs past its end`);
  if (at % Type.BYTES_PER_ELEMENT === 0) return new Type(bytes.buffer, at, count);
  return new Type(bytes.slice(offset, offset + count * Type.BYTES_PER_ELEMENT).buffer);
}

// The adapted graphs' lora.* inputs, made once (at load) and then only rewritten.
export class LoraInputs {
  // shapes: loraShapes(manifest); dtype: the variant's float type; device: the sessions' GPUDevice on
  // WebGPU (GPU tensors), null on wasm (CPU tensors).
  /**
   * @param {Ort} ort
   * @param {Record<string, number[]>} shapes
   * @param {'float16' | 'float32'} dtype
   * @param {GPUDevice | null} [device]
   * @param {{packed?: Record<string, string[]>, bits?: Record<string, number>, joint?: JointTable,
   *   file?: (name: string) => Uint8Array | undefined, merged?: Record<string, string[]>,
   *   delta?: import('webbuild-types').OrtSession | null}} [step] runtime.json's lora_packed_ups (the groups whose
   *   ups a step form may read as one) and lora_down_bits (loraValues); the manifest variant's lora_joint and the
   *   loaded files by name (a joined group's base rows come from the decoder's weights file, at load);
   *   runtime.json's lora_delta_groups and the delta graph's session (the merged updates it makes at a switch)
   */
  constructor(ort, shapes, dtype, device = null, step = {}) {
    this.ort = ort;
    this.dtype = dtype;
    this.device = device;
    this.shapes = shapes;
    /** @type {Record<string, number[]>} the rows of each GPU buffer that may hold non-zero values now */
    this.written = {};
    /** @type {Record<string, OrtTensor>} the adapted graph's inputs */
    this.feeds = {};
    for (const [name, dims] of Object.entries(shapes)) this.feeds[name] = device ? this.gpuTensor(dims) : this.cpuTensor(dims);
    this.packed = step.packed ?? {};
    this.bits = step.bits ?? {};
    this.joint = step.joint ?? {};
    this.file = step.file ?? (() => undefined);
    /** @type {Record<string, string>} each merged projection's group */
    this.mergedGroup = Object.fromEntries(Object.entries(step.merged ?? {}).flatMap(([g, projs]) => projs.map((p) => [p, g])));
    this.delta = step.delta ?? null;
    /** @type {Record<string, OrtTensor>} its step form's (WebGPU only, made by stepFeedsFor) */
    this.stepFeeds = {};
  }

  // The step form's lora inputs among `names` (its session's inputNames), made once: an up or down it shares
  // with the adapted graph is that graph's tensor; each down's codes and scales, and a packed group's up (the
  // members' ups side by side: webbuild/pipeline/lora_form.py packed_updates), get GPU buffers of their own.
  /** @param {readonly string[]} names */
  stepFeedsFor(names) {
    const downs = Object.fromEntries(Object.keys(this.shapes).filter((n) => DOWN.test(n)).flatMap((down) =>
      Object.entries(stepShapes(down, this.shapes[down], downBits(down, this.bits)))));
    const joint = Object.fromEntries(Object.entries(this.joint).flatMap(([key, e]) => Object.entries(jointShapes(key, e))));
    for (const name of names.filter((n) => !(n in this.stepFeeds))) {
      const packed = !(name in this.feeds) && !(name in downs) && !(name in joint) && this.packedUp(name);
      const merged = MERGED.exec(name);
      if (name in this.feeds) this.stepFeeds[name] = this.feeds[name];
      else if (name in joint) {
        this.stepFeeds[name] = this.gpuTensor(joint[name], /codes$/.test(name) ? 'uint8' : this.dtype);
        this.write(name, this.jointStart(name));
        continue;
      } else if (name in downs) this.stepFeeds[name] = this.gpuTensor(downs[name], name.endsWith(CODES) ? 'uint8' : this.dtype);
      else if (merged) this.stepFeeds[name] = this.gpuTensor(this.deltaShape(name, merged), merged[3] === 'codes' ? 'uint8' : this.dtype);
      else if (packed) this.stepFeeds[name] = this.gpuTensor([packed.rank, packed.widths.reduce((a, b) => a + b)]);
      else continue; // not an adapter input
      // zeros are no adapter, but codes of zero are -128 (-8): the base model's codes are the zero point
      const bits = name.endsWith(CODES) ? downBits(name, this.bits) : name.endsWith(DELTA.codes) ? DELTA.bits : 0;
      if (bits) this.write(name, zeroCodes(this.stepFeeds[name].dims, bits));
    }
    return Object.fromEntries(names.filter((n) => n in this.stepFeeds).map((n) => [n, this.stepFeeds[n]]));
  }

  // A merged update's step input [out, in / 32, 16] (codes) or [out, in / 32] (scales), by its projection's up [R, out]
  // and its group's down [in, R]; `merged`: MERGED's match of its name.
  /**
   * @param {string} name
   * @param {RegExpExecArray} merged
   */
  deltaShape(name, [, prefix, proj, factor]) {
    const group = this.mergedGroup[proj];
    const down = this.shapes[`${prefix}${group}.down`], up = this.shapes[`${prefix}${proj}.up`];
    if (!this.delta) throw new Error(`adapted step input ${name}: the build ships no delta graph to make it; rebuild the site`);
    if (!down || !up) throw new Error(`adapted step input ${name}: no adapter input of its group ${group ?? '(none in runtime.json lora_delta_groups)'}`);
    const blocks = Math.ceil(down[0] / BLOCK);
    return factor === 'codes' ? [up[1], blocks, (BLOCK * DELTA.bits) / 8] : [up[1], blocks];
  }

  // The merged updates from the adapted graph's downs and ups, as they are now: the delta graph run once per layer,
  // reading those GPU tensors and writing into the step's (pre-allocated outputs: no copy, no read-back). Its names
  // are a layer's without the layer's prefix (webbuild/pipeline/lora_delta.py).
  async computeDeltas() {
    const delta = this.delta;
    if (!delta) return;
    const layers = new Set(Object.keys(this.stepFeeds).map((n) => MERGED.exec(n)?.[1]).filter((l) => l !== undefined));
    for (const layer of layers) {
      const named = (/** @type {readonly string[]} */ names, /** @type {Record<string, OrtTensor>} */ from) =>
        Object.fromEntries(names.map((n) => {
          if (!from[layer + n]) throw new Error(`the delta graph's ${n}: no ${layer + n} among the adapter's inputs; rebuild the site`);
          return [n, from[layer + n]];
        }));
      await delta.run(named(delta.inputNames, this.feeds), named(delta.outputNames, this.stepFeeds));
    }
  }

  // A joined group's step input as it starts (adapter_pack.py joint_inputs without an adapter): the joint weights
  // with the projection's rows from the decoder's weights file and zero codes and scales after them; the up's
  // identity with zero codes and scales below it.
  /** @param {string} name */
  jointStart(name) {
    const key = name.slice(0, name.lastIndexOf('.')), e = this.joint[key];
    if (name.endsWith(JOINT.upCodes) || name.endsWith(JOINT.upScales)) return jointValues(`${key}.up`, null, e, this.dtype)[name];
    const codes = name.endsWith(JOINT.codes);
    const [offset, length] = codes ? e.codes : e.scales;
    const perRow = e.blocks * (codes ? (e.block * e.bits) / 8 : this.dtype === 'float16' ? 2 : 4);
    const weights = this.file(e.location);
    if (length !== perRow * e.out) throw new Error(`manifest lora_joint ${key}: ${length} bytes of ${codes ? 'codes' : 'scales'} for ${e.out} rows of ${perRow}; rebuild the site`);
    if (!weights || weights.length < offset + length) throw new Error(`adapted step input ${name}: the weights file ${e.location} is not loaded or too short`);
    const all = new Uint8Array(perRow * (e.rows + e.rank)).fill(codes ? zeroCodeByte(e.bits) : 0);
    all.set(weights.subarray(offset, offset + length));
    return all;
  }

  // A packed group's up input `lora.{i}.{group}.up`: its members' up inputs, their rank and widths; null for
  // another name.
  /** @param {string} name */
  packedUp(name) {
    const m = /^(.*)\.([^.]+)\.up$/.exec(name);
    const members = m && this.packed[m[2]]?.map((proj) => `${m[1]}.${proj}.up`);
    if (!m || !members?.every((up) => up in this.shapes)) return null;
    return { members, rank: this.shapes[members[0]][0], widths: members.map((up) => this.shapes[up][1]) };
  }

  // A zero-filled GPU tensor (WebGPU zero-initialises new buffers): the base model until an adapter is written.
  /**
   * @param {number[]} dims
   * @param {'float16' | 'float32' | 'uint8'} [dataType]
   */
  gpuTensor(dims, dataType = this.dtype) {
    if (!this.device) throw new Error('GPU tensors need the sessions\' GPUDevice');
    const bytes = dims.reduce((a, b) => a * b) * { float16: 2, float32: 4, uint8: 1 }[dataType];
    const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
    const buffer = this.device.createBuffer({ size: Math.ceil(bytes / 16) * 16, usage });
    return this.ort.Tensor.fromGpuBuffer(buffer, { dataType, dims });
  }

  /**
   * @param {number[]} dims
   * @param {Float32Array | Uint16Array | null} [data]
   */
  cpuTensor(dims, data = null) {
    const Type = this.dtype === 'float16' ? Uint16Array : Float32Array;
    return new this.ort.Tensor(this.dtype, data ?? new Type(dims[0] * dims[1]), dims);
  }

  // An adapter's values (loraValues in this dtype) into the inputs: written into the same GPU buffers,
  // or new CPU tensors. rows (loraRows): where the values may be non-zero; a GPU buffer gets those rows and
  // the ones the adapter before may have filled (an up's own rows of its group: a third of the values).
  // The step's merged updates are then computed from them (computeDeltas).
  /**
   * @param {LoraValues} values
   * @param {Record<string, number[]>} [rows]
   */
  async set(values, rows = {}) {
    for (const [name, dims] of Object.entries(this.shapes)) {
      const data = /** @type {Float32Array<ArrayBuffer> | Uint16Array<ArrayBuffer>} a float input's */ (values[name]);
      if (!data || data.length !== dims[0] * dims[1]) throw new Error(`adapter input ${name}: expected ${dims.join('x')} values`);
      if (!this.device) {
        this.feeds[name] = this.cpuTensor(dims, data);
        continue;
      }
      const now = rows[name] ?? [0, dims[0]], before = this.written[name] ?? now;
      this.writeRows(name, data, dims[1], Math.min(now[0], before[0]), Math.max(now[1], before[1]));
      this.written[name] = now;
    }
    for (const name of Object.keys(this.stepFeeds)) {
      if (name in this.feeds || MERGED.test(name)) continue; // an up: written above; a merged update: computed below
      const packed = this.packedUp(name);
      const data = packed ? sideBySide(packed.members.map((up) => values[up]), packed.rank, packed.widths) : values[name];
      if (!data) throw new Error(`adapter input ${name}: no values (lora.js loraValues makes them)`);
      this.write(name, data, this.jointOffset(name, data));
    }
    await this.computeDeltas();
  }

  // Where a step input's values go in its buffer, in bytes: a joint's down rows after the projection's, 0 otherwise.
  /**
   * @param {string} name
   * @param {LoraValues[string]} data
   */
  jointOffset(name, data) {
    const e = this.joint[name.slice(0, name.lastIndexOf('.'))];
    return e && (name.endsWith(JOINT.codes) || name.endsWith(JOINT.scales)) ? (data.byteLength / e.rank) * e.rows : 0;
  }

  // All of `data` into a step input's GPU buffer, from byte `offset`.
  /**
   * @param {string} name
   * @param {Float32Array<ArrayBuffer> | Uint16Array<ArrayBuffer> | Uint8Array<ArrayBuffer>} data
   * @param {number} [offset]
   */
  write(name, data, offset = 0) {
    /** @type {GPUDevice} */ (this.device).queue.writeBuffer(this.stepFeeds[name].gpuBuffer, offset, data);
  }

  // Rows [start, stop) of `data` ([K, N] row-major) into the input's GPU buffer, at 4-byte bounds (float16:
  // an odd N writes every row).
  /**
   * @param {string} name
   * @param {Float32Array<ArrayBuffer> | Uint16Array<ArrayBuffer>} data
   * @param {number} n
   * @param {number} start
   * @param {number} stop
   */
  writeRows(name, data, n, start, stop) {
    if (data.BYTES_PER_ELEMENT === 2 && n % 2) [start, stop] = [0, data.length / n];
    if (stop <= start) return;
    const device = /** @type {GPUDevice} */ (this.device);
    device.queue.writeBuffer(this.feeds[name].gpuBuffer, start * n * data.BYTES_PER_ELEMENT, data, start * n, (stop - start) * n);
  }
}

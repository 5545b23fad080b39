// An adapter's shipped file (docs/adapters.md, "Adapter files"): the manifest's top-level `adapters`, one file per
// adapter (`adapter.<name>.bin`), read into the adapted decoder graph's `lora.{i}.{group}.down` and
// `lora.{i}.{proj}.up` values. A file stores an input's rows from `rows` [start, stop) on (an up's own rows of its
// group's rank), the rest zeros. webbuild/site/adapter_pack.py packs it (and unpacks it, bit for bit the same).

import { floatsToHalfs, halfsToFloats } from './half.js';
import { loadFiles } from './loader.js';

/** @typedef {import('webbuild-types').Manifest} Manifest */
/** @typedef {NonNullable<Manifest['adapters']>[string]} Adapter  a manifest `adapters` entry */
/** @typedef {Adapter['tensors'][string]} AdapterTensor */

export const BLOCK = 32; // MatMulNBits' blocks along K
export const ZERO_POINT = 128; // int8's

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

// {input name: [start, stop)}: the rows of each input an adapter's file stores, the others being zeros.
/**
 * @param {Adapter} entry
 * @returns {Record<string, number[]>}
 */
export function loraRows(entry) {
  return Object.fromEntries(Object.entries(entry.tensors).map(([name, t]) => [name, t.rows ?? [0, t.shape[0]]]));
}

// One input of an adapter file, [K * N] row-major, in `dtype`: Float32Array for 'float32', float16 bits
// (Uint16Array, as onnxruntime-web takes float16 data) for 'float16' (float32 values rounded to half, nearest even,
// as numpy's astype(float16); an fp16 file's bits as they are).
/**
 * @param {Uint8Array} bytes
 * @param {Adapter['precision']} precision
 * @param {AdapterTensor} t
 * @param {'float16' | 'float32'} dtype
 * @returns {Float32Array<ArrayBuffer> | Uint16Array<ArrayBuffer>}
 */
export function tensorValues(bytes, precision, t, dtype) {
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

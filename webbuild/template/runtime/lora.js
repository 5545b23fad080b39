// LoRA adapters (docs/adapters.md): a build's adapters switched on and off. The work is split by job:
// lora-file.js reads an adapter's file into the adapted graph's `down` and `up` values; lora-encode.js makes the
// adapted step form's inputs of each layout kind from them (the manifest variant's `lora_layout`); lora-inputs.js
// holds the GPU (or wasm CPU) inputs the adapted sessions read; lora-delta.js runs the delta graph that makes the
// step's merged updates.

import { floatsToHalfs } from './half.js';
import { encodedSources, stepValues } from './lora-encode.js';
import { loadLoraFile, loraRows, tensorValues } from './lora-file.js';

export { dequantizeInt8, loadLoraFile, loraAbout, loraNames, loraRows, loraShapes } from './lora-file.js';
export { LoraInputs } from './lora-inputs.js';

/** @typedef {import('./lora-file.js').Adapter} Adapter */
/** @typedef {import('./lora-encode.js').LoraLayout} LoraLayout */
/** @typedef {import('./lora-encode.js').LoraValues} LoraValues */

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
  await recogniser.setLora(loraValues(bytes, entry, recogniser.dtype, recogniser.loraLayout), loraRows(entry));
  return name;
}

// {input name: values} of an adapter file: its tensors in the graph's float type (Float32Array for 'float32',
// float16 bits as Uint16Array for 'float16') and the step form's inputs `layout` makes of them (lora-encode.js
// stepValues); the tensors those read are read once as float32.
/**
 * @param {Uint8Array} bytes the adapter file
 * @param {Adapter} entry
 * @param {'float16' | 'float32'} [dtype]
 * @param {LoraLayout} [layout]
 * @returns {LoraValues}
 */
export function loraValues(bytes, entry, dtype = 'float32', layout = {}) {
  /** @type {LoraValues} */
  const out = {};
  /** @type {Record<string, Float32Array>} */
  const f32 = {};
  const encoded = encodedSources(layout);
  for (const [name, t] of Object.entries(entry.tensors)) {
    if (!encoded.has(name)) {
      out[name] = tensorValues(bytes, entry.precision, t, dtype);
      continue;
    }
    f32[name] = /** @type {Float32Array<ArrayBuffer>} */ (tensorValues(bytes, entry.precision, t, 'float32'));
    out[name] = dtype === 'float16' ? floatsToHalfs(f32[name]) : /** @type {Float32Array<ArrayBuffer>} */ (f32[name]);
  }
  const shapes = Object.fromEntries(Object.entries(entry.tensors).map(([name, t]) => [name, t.shape]));
  return Object.assign(out, stepValues(f32, shapes, layout, dtype));
}

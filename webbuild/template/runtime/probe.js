// Capability probe: which execution provider and which precision variant this device gets.
// Runs in the worker (navigator.gpu exists in dedicated workers). "GPU" here is WebGPU's GPUAdapter
// (the API's name for it); "adapter" elsewhere in the runtime is a LoRA adapter (lora.js).

import { within } from './within.js';

const ADAPTER_WAIT_MS = 10000; // how long requestAdapter() may take before the page takes the CPU path

/**
 * What probeWebGPU found: gpuAdapter null and why, or the adapter and what it offers.
 * @typedef {object} GpuProbe
 * @property {GPUAdapter | null} gpuAdapter
 * @property {string} [reason] why there is no adapter
 * @property {string} [description]
 * @property {boolean} [fallback] WebGPU's fallback adapter
 * @property {boolean} [software] a software renderer (softwareGpu)
 * @property {Set<string>} [features]
 * @property {boolean} [shaderF16]
 * @property {{maxBufferSize: number, maxStorageBufferBindingSize: number}} [limits]
 */
/** @typedef {{vendor?: string, architecture?: string, device?: string, description?: string}} GpuInfo */

/** @returns {Promise<GpuProbe>} */
export async function probeWebGPU() {
  if (!globalThis.navigator?.gpu) return { gpuAdapter: null, reason: 'this browser has no WebGPU (navigator.gpu is missing)' };
  let gpuAdapter;
  try {
    // bounded: a browser whose request never answers gets the CPU path, not a load that waits for good
    gpuAdapter = await within(navigator.gpu.requestAdapter({ powerPreference: 'high-performance' }), ADAPTER_WAIT_MS,
      'the WebGPU adapter request');
  } catch (e) {
    return { gpuAdapter: null, reason: `WebGPU adapter request failed: ${e.message}` };
  }
  if (!gpuAdapter) return { gpuAdapter: null, reason: 'WebGPU is present but no adapter is available (disabled, blocklisted or no GPU)' };
  /** @type {Partial<GPUAdapterInfo>} */
  const info = gpuAdapter.info ?? {};
  // GPUAdapterInfo.isFallbackAdapter, or GPUAdapter's in browsers before it moved
  const fallback = Boolean(info.isFallbackAdapter ?? /** @type {{isFallbackAdapter?: boolean}} */ (gpuAdapter).isFallbackAdapter);
  return {
    gpuAdapter,
    description: [info.vendor, info.architecture, info.device, info.description].filter(Boolean).join(' / ') || 'unknown GPU',
    fallback,
    software: softwareGpu(info, fallback),
    features: new Set(gpuAdapter.features), // what a variant may require (manifest entry `requires`)
    shaderF16: gpuAdapter.features.has('shader-f16'),
    limits: { maxBufferSize: gpuAdapter.limits.maxBufferSize, maxStorageBufferBindingSize: gpuAdapter.limits.maxStorageBufferBindingSize },
  };
}

// A WebGPU GPU that renders on the CPU (no GPU behind it) decodes far slower than the wasm EP on
// the same CPU (SwiftShader: ~1-3 tokens/s against ~30-120 on a 2-core box, BENCHMARKS.md), so the
// page takes wasm there. Known by WebGPU's fallback-adapter flag, else by the name of a software renderer.
const SOFTWARE_RENDERERS = /swiftshader|llvmpipe|lavapipe|softpipe|software|microsoft basic render driver/i;

/**
 * @param {GpuInfo} info
 * @param {boolean} [fallback]
 */
export function softwareGpu(info, fallback = false) {
  return fallback || SOFTWARE_RENDERERS.test([info.vendor, info.architecture, info.device, info.description].join(' '));
}

// The execution-provider entry for WebGPU sessions. onnxruntime-web 1.30's WebGPU flash attention
// (MultiHeadAttention, and GroupQueryAttention for 32+ new tokens) assumes subgroups of at least 8
// lanes and returns wrong results on GPUs with smaller ones (SwiftShader: 4). There the sessions
// get a device without the subgroups feature, and onnxruntime takes its subgroup-free attention path.
export const MIN_SUBGROUP_SIZE = 8;
/** @typedef {'basic' | 'wgpuOnly'} GpuValidation */
/** @type {GpuValidation} */
export const GPU_VALIDATION = 'basic';

// validation: onnxruntime-web's validationMode ('basic', its default, wraps every run in a GPU error scope whose
// answer the run waits for; 'wgpuOnly' leaves the checks to the browser's WebGPU); any other value (the page's
// ?gpu_validation= as typed) is the default.
/**
 * @param {GPUAdapter | null} gpuAdapter
 * @param {string} [asked]
 * @returns {Promise<{name: 'webgpu', validationMode: GpuValidation, device?: GPUDevice}>}
 */
export async function webgpuProvider(gpuAdapter, asked = GPU_VALIDATION) {
  const validation = asked === 'basic' || asked === 'wgpuOnly' ? asked : GPU_VALIDATION;
  const min = gpuAdapter?.info?.subgroupMinSize;
  if (!gpuAdapter?.features.has('subgroups') || !(/** @type {number} */ (min) < MIN_SUBGROUP_SIZE)) return { name: 'webgpu', validationMode: validation };
  /** @type {Record<string, number>} */
  const requiredLimits = {};
  for (const key in gpuAdapter.limits) requiredLimits[key] = /** @type {Record<string, number>} */ (/** @type {unknown} */ (gpuAdapter.limits))[key];
  const requiredFeatures = /** @type {GPUFeatureName[]} */ ([...gpuAdapter.features]).filter((f) => !f.startsWith('subgroup'));
  return { name: 'webgpu', validationMode: validation, device: await gpuAdapter.requestDevice({ requiredFeatures, requiredLimits }) };
}

// Picks {ep, variant}: without a GPU, or with a software one unless forceEp is 'webgpu', the wasm EP
// on the CPU, else WebGPU; the variant is the first of `order` (runtime.json's `variants`, preferred
// first; webbuild/site/contract.py VARIANTS) that the manifest ships and the EP may run (its entry's
// `providers`: wasm runs fp32), on WebGPU one whose `requires` the GPU has (fp16 needs shader-f16,
// which software renderers and many Linux drivers lack).
/**
 * @param {import('webbuild-types').Manifest} manifest
 * @param {GpuProbe} gpu
 * @param {string | null | undefined} forceEp
 * @param {string[]} [order]
 * @returns {{ep: 'webgpu' | 'wasm', variant: string}}
 */
export function chooseVariant(manifest, gpu, forceEp, order = Object.keys(manifest.variants ?? {})) {
  const variants = manifest.variants ?? {};
  const names = order.filter((name) => name in variants);
  /** @param {string} name @param {'webgpu' | 'wasm'} ep */
  // providers: the build writes them for every variant (pipeline/stages.py), though the schema has them optional
  const runs = (name, ep) => /** @type {('webgpu' | 'wasm')[]} */ (variants[name].providers).includes(ep);
  /** @param {string} name */
  const fits = (name) =>
 (variants[name].requires ?? []).every((f) => gpu.features?.has(f));
  if (forceEp === 'wasm' || !gpu.gpuAdapter || (gpu.software && forceEp !== 'webgpu')) {
    return { ep: 'wasm', variant: names.find((name) => runs(name, 'wasm')) ?? names[0] };
  }
  return { ep: 'webgpu', variant: names.find((name) => runs(name, 'webgpu') && fits(name)) ?? names[0] };
}

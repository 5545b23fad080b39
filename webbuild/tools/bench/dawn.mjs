// WebGPU in Node through Dawn (the `webgpu` npm package's dawn.node), set up the way
// onnxruntime-web expects it in a browser: navigator.gpu plus the GPU* globals.
// Vulkan driver choice is the environment's: VK_DRIVER_FILES / VK_ICD_FILENAMES (SwiftShader
// here, the NVIDIA ICD on a GPU machine).
// Every Dawn session is counted (counters.mjs) and timed (timing.mjs): the wraps cost a function call
// per WebGPU call, and the timing wrap two performance.now() calls (timing_per_token reports how much).
import { create, globals } from 'webgpu';

import { installGpuCounters } from './counters.mjs';
import { installGpuTiming } from './timing.mjs';

// Dawn rounds timestamp-query values to 65536 ns unless told not to (its anti-fingerprinting default,
// toggle `timestamp_quantization`); kernels of a few µs need the raw values.
const DAWN_TOGGLES = ['disable-dawn-features=timestamp_quantization'];

export function installDawn() {
  Object.assign(globalThis, globals);
  // Node 20 has no navigator; Node >= 21 has one without gpu.
  const gpu = create(DAWN_TOGGLES);
  if (globalThis.navigator) Object.defineProperty(globalThis.navigator, 'gpu', { value: gpu, configurable: true });
  else /** @type {{navigator: {gpu: GPU}}} */ (/** @type {unknown} */ (globalThis)).navigator = { gpu };
  shimWriteBuffer();
  shimBindGroups();
  // after the shims: each call onnxruntime-web makes is counted once; the timing wrap inside the counters'
  // so that webgpu_call_ms is the calls' own cost (Dawn and the shims), not the counting
  installGpuTiming(globalThis);
  installGpuCounters(globalThis);
  return gpu;
}

// dawn.node rejects writeBuffer from a SharedArrayBuffer view (threaded ORT's wasm heap is one):
// copy such views into an ordinary ArrayBuffer first.
function shimWriteBuffer() {
  const write = GPUQueue.prototype.writeBuffer;
  /**
   * @this {GPUQueue}
   * @param {GPUBuffer} buffer
   * @param {number} offset
   * @param {GPUAllowSharedBufferSource} data
   * @param {number} [dataOffset]
   * @param {number} [size]
   */
  GPUQueue.prototype.writeBuffer = function (buffer, offset, data, dataOffset, size) {
    if (typeof SharedArrayBuffer !== 'undefined' && (data instanceof SharedArrayBuffer || /** @type {ArrayBufferView} */ (data)?.buffer instanceof SharedArrayBuffer)) {
      // a view on a SharedArrayBuffer: a typed array (onnxruntime-web writes those)
      data = data instanceof SharedArrayBuffer ? new Uint8Array(data).slice() : /** @type {Uint8Array} */ (data).slice();
    }
    return write.call(this, buffer, offset, data, ...[dataOffset, size].filter((v) => v !== undefined));
  };
}

// Browsers accept a bare GPUBuffer as a bind-group entry's resource (newer spec); dawn.node
// wants {buffer}.
function shimBindGroups() {
  const createBindGroup = GPUDevice.prototype.createBindGroup;
  /** @this {GPUDevice} @param {GPUBindGroupDescriptor} desc */
  GPUDevice.prototype.createBindGroup = function (desc) {
    // onnxruntime-web passes an array (the type allows any iterable)
    const entries = /** @type {GPUBindGroupEntry[]} */ (desc.entries).map((e) => (e.resource instanceof GPUBuffer ? { ...e, resource: { buffer: e.resource } } : e));
    return createBindGroup.call(this, { ...desc, entries });
  };
}

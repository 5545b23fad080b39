// WebGPU call counters for Node + Dawn (issue 15 part 2; issue 14 will make them part of every bench
// report). Preloaded before the bench harness (`NODE_OPTIONS=--import=<this file>`), it wraps the
// prototypes of the `webgpu` package's GPU* classes, the ones dawn.mjs puts on globalThis, so every
// call onnxruntime-web makes through them is counted; at exit the totals go to $GPU_COUNTS_FILE as
// JSON. Per decode token = (totals of a long run - totals of a short run) / (token difference).
// scripts/chrome_gpu_bench.py wraps the same calls in Chromium (its COUNTERS_JS).
import { writeFileSync } from 'node:fs';
import { globals } from 'webgpu';

const counts = { dispatch: 0, submit: 0, mapAsync: 0, writeBuffer: 0, writeBytes: 0, bindGroup: 0 };
const wrap = (proto, name, count) => {
  const f = proto[name];
  proto[name] = function (...a) { count(a); return f.apply(this, a); };
};
wrap(globals.GPUComputePassEncoder.prototype, 'dispatchWorkgroups', () => { counts.dispatch++; });
wrap(globals.GPUQueue.prototype, 'submit', () => { counts.submit++; });
wrap(globals.GPUBuffer.prototype, 'mapAsync', () => { counts.mapAsync++; });
wrap(globals.GPUDevice.prototype, 'createBindGroup', () => { counts.bindGroup++; });
wrap(globals.GPUQueue.prototype, 'writeBuffer', ([, , data, dataOffset, size]) => {
  const el = data?.BYTES_PER_ELEMENT ?? 1; // offset and size count elements for typed arrays
  counts.writeBuffer++;
  counts.writeBytes += size !== undefined ? size * el : (data?.byteLength ?? 0) - (dataOffset ?? 0) * el;
});
globalThis.__gpuCounts = counts;
process.on('exit', () => {
  if (process.env.GPU_COUNTS_FILE) writeFileSync(process.env.GPU_COUNTS_FILE, JSON.stringify(counts));
});

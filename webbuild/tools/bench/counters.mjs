// WebGPU call counters: what a decode token costs the GPU driver, counted from the calls
// onnxruntime-web makes (never estimated from graph nodes). installGpuCounters(scope) wraps the
// prototypes of scope's GPU* classes; it must run before onnxruntime-web creates its device.
//   Node + Dawn: dawn.mjs calls it on globalThis once it has put the `webgpu` package's classes there.
//   Chromium: this file's source, `export` words stripped, is prepended to the site's worker.js in a
//   bench-only copy of the site (webbuild/tools/bench/page_bench.py); the worker is where onnxruntime-web
//   runs and Playwright's init scripts do not reach workers. So this file stays self-contained (no
//   imports) and its top-level names are prefixed to stay clear of worker.js's own.
// Per decode token = (counts of a long decode - counts of a short one) / (token difference):
// gpuCountersPerToken. The keys are the report's `counters_per_token` (docs/architecture.md).

/**
 * WebGPU calls counted since install; kernels: dispatches per pipeline name; pipelines: compute pipelines
 * created (each one a shader compile: what a new input shape can cost, tools/bench/first_use.py).
 * indirect: the dispatches made with dispatchWorkgroupsIndirect (counted in dispatches too: Chromium's Dawn validates
 * each with a pass of its own, docs/graph-capture.md).
 * @typedef {{dispatches: number, indirect: number, submits: number, readbacks: number, write_buffers: number,
 *   write_bytes: number, bind_groups: number, buffers: number, buffer_bytes: number, pipelines: number,
 *   kernels: Record<string, number>}} GpuCounts
 */
/**
 * The counters' state (scope.__gpuCounters).
 * @typedef {object} GpuCounters
 * @property {GpuCounts} counts
 * @property {{name: string, at: number}[]} created every compute pipeline made, in order: its name and when
 *   (performance.now())
 * @property {() => GpuCounts} snapshot
 * @property {(p: GPUComputePipeline | null) => string} pipelineName
 */
/** @typedef {import('./timing.mjs').GpuScope} GpuScope */
/** @typedef {Exclude<keyof GpuCounts, 'kernels'>} CountKey */
/** @template F @typedef {F extends (...args: infer A) => any ? A : never} Args  a method's arguments */
/** @template F @typedef {F extends (...args: any) => infer R ? R : never} Ret  a method's result */

// Totals so far; a snapshot is a plain copy (kernels included), safe to keep and subtract.
/**
 * @param {GpuScope} [scope]
 * @returns {GpuCounters}
 */
export function installGpuCounters(scope = globalThis) {
  if (scope.__gpuCounters) return scope.__gpuCounters;
  /** @type {GpuCounts} */
  const counts = {
    dispatches: 0, indirect: 0, submits: 0, readbacks: 0, write_buffers: 0, write_bytes: 0, bind_groups: 0, buffers: 0, buffer_bytes: 0,
    pipelines: 0, kernels: {},
  };
  /** @type {{name: string, at: number}[]} */
  const created = [];
  /** @type {WeakMap<GPUComputePipeline, string>} */
  const pipelineNames = new WeakMap(); // GPUComputePipeline -> readable name
  /** @type {WeakMap<GPUComputePassEncoder, string>} */
  const passPipeline = new WeakMap(); // GPUComputePassEncoder -> name of the pipeline it has set
  /**
   * proto[method] wrapped: before(args) ahead of it, after(its result, args) on its way out.
   * @template P
   * @template {keyof P & string} M
   * @param {P | undefined} proto
   * @param {M} method
   * @param {((this: P, args: Args<P[M]>) => void) | null} before
   * @param {(this: P, r: Ret<P[M]>, args: Args<P[M]>) => Ret<P[M]>} [after]
   */
  const wrap = (proto, method, before, after) => {
    const f = proto?.[method];
    if (typeof f !== 'function') return;
    // the wrapper stands in for proto[method], whatever its type
    /** @type {any} */ (proto)[method] = /** @this {P} @param {Args<P[M]>} args */ function (...args) {
      before?.call(this, args);
      const r = f.apply(this, args);
      return after ? after.call(this, r, args) : r;
    };
  };
  /** @param {GPUComputePipelineDescriptor} desc */
  const name = (desc) => gpuPipelineName(desc);
  /** @param {GPUComputePipelineDescriptor} desc */
  const made = (desc) => {
    counts.pipelines++;
    created.push({ name: name(desc), at: performance.now() });
  };
  const dev = scope.GPUDevice?.prototype;
  wrap(dev, 'createComputePipeline', ([desc]) => made(desc), (p, [desc]) => { pipelineNames.set(p, name(desc)); return p; });
  wrap(dev, 'createComputePipelineAsync', ([desc]) => made(desc), (pr, [desc]) => pr.then((p) => { pipelineNames.set(p, name(desc)); return p; }));
  wrap(dev, 'createBindGroup', () => { counts.bind_groups++; });
  wrap(dev, 'createBuffer', ([desc]) => { counts.buffers++; counts.buffer_bytes += desc?.size ?? 0; });
  const pass = scope.GPUComputePassEncoder?.prototype;
  wrap(pass, 'setPipeline', /** @this {GPUComputePassEncoder} */ function ([p]) { passPipeline.set(this, pipelineNames.get(p) ?? p?.label ?? '(unnamed)'); });
  const dispatched = /** @this {GPUComputePassEncoder} */ function () {
    const k = passPipeline.get(this) ?? '(no pipeline)';
    counts.dispatches++;
    counts.kernels[k] = (counts.kernels[k] ?? 0) + 1;
  };
  wrap(pass, 'dispatchWorkgroups', dispatched);
  wrap(pass, 'dispatchWorkgroupsIndirect', /** @this {GPUComputePassEncoder} */ function () {
    dispatched.call(this);
    counts.indirect++;
  });
  const queue = scope.GPUQueue?.prototype;
  wrap(queue, 'submit', () => { counts.submits++; });
  wrap(queue, 'writeBuffer', ([, , data, dataOffset, size]) => {
    const el = /** @type {{BYTES_PER_ELEMENT?: number}} */ (data)?.BYTES_PER_ELEMENT ?? 1; // dataOffset and size count elements for typed arrays, bytes otherwise
    counts.write_buffers++;
    counts.write_bytes += size !== undefined ? size * el : (data?.byteLength ?? 0) - (dataOffset ?? 0) * el;
  });
  wrap(scope.GPUBuffer?.prototype, 'mapAsync', () => { counts.readbacks++; });
  /** @type {GpuCounters} */
  const counters = {
    counts, created, snapshot: () => ({ ...counts, kernels: { ...counts.kernels } }),
    // WeakMap.get(null) is undefined
    pipelineName: (p) => pipelineNames.get(/** @type {GPUComputePipeline} */ (p))
 ?? p?.label ?? '(unnamed)', // timing.mjs names its kernels so too
  };
  scope.__gpuCounters = counters;
  return counters;
}

// A pipeline's readable name: its label (onnxruntime-web labels each pipeline with the program that
// issued it), else the shader module's label, else the first WGSL entry point's name.
/** @param {GPUComputePipelineDescriptor | undefined} desc */
export function gpuPipelineName(desc) {
  const mod = desc?.compute?.module;
  if (desc?.label) return desc.label;
  if (mod?.label) return mod.label;
  return desc?.compute?.entryPoint ?? '(unnamed)';
}

// The calls made between two snapshots (kernels included; kernels that did not run are left out).
/**
 * @param {GpuCounts} a
 * @param {GpuCounts} b
 * @returns {GpuCounts}
 */
export function gpuCountsDelta(a, b) {
  const out = /** @type {GpuCounts} */ (/** @type {unknown} */ ( // kernels set below
    Object.fromEntries(/** @type {CountKey[]} */ (Object.keys(b).filter((k) => k !== 'kernels')).map((k) => [k, b[k] - a[k]]))));
  out.kernels = Object.fromEntries(Object.keys(b.kernels).map((k) => [k, b.kernels[k] - (a.kernels[k] ?? 0)])
    .filter(([, v]) => v !== 0));
  return out;
}

// (long - short) / (nLong - nShort) for every count and every kernel; kernels sorted by count, most first.
/**
 * @param {GpuCounts} short
 * @param {GpuCounts} long
 * @param {number} nShort
 * @param {number} nLong
 * @returns {GpuCounts} per token, rounded to 2 decimals
 */
export function gpuCountersPerToken(short, long, nShort, nLong) {
  /** @param {number | undefined} a @param {number | undefined} b */
  const per = (a, b) => Math.round(((b ?? 0) - (a ?? 0)) / (nLong - nShort) * 100) / 100;
  const out = /** @type {GpuCounts} */ ({}); // filled below
  for (const k of /** @type {(keyof GpuCounts)[]} */ (Object.keys(long))) if (k !== 'kernels') out[k] = per(short[k], long[k]);
  const kernels = Object.keys(long.kernels)
    .map((k) => /** @type {[string, number]} */ ([k, per(short.kernels[k], long.kernels[k])])).filter(([, v]) => v !== 0);
  out.kernels = Object.fromEntries(kernels.sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1)));
  return out;
}

// The short decode of the pair: a quarter of the long one, at least 1 token.
/** @param {number} nLong */
export const gpuShortDecode = (nLong) => Math.max(1, Math.floor(nLong / 4));

// decode(n) runs n decode steps after the same prompt. Runs a short then the long decode (the short
// one also warms the long one up) and returns the long one's result with `counters_per_token`: null
// when not counted (ep other than webgpu: the wasm EP makes no WebGPU calls, so zeros would lie; or
// fewer than 2 tokens). The prompt's encoder and prefill are in both runs and cancel out.
/**
 * @template R
 * @param {(n: number) => Promise<R>} decode
 * @param {number} nLong
 * @param {boolean} counted
 * @param {GpuScope} [scope]
 */
export async function gpuCountedDecodes(decode, nLong, counted, scope = globalThis) {
  const c = counted && nLong >= 2 ? scope.__gpuCounters : null;
  if (!c) return { result: await decode(nLong), counters_per_token: null };
  const nShort = gpuShortDecode(nLong);
  const s0 = c.snapshot();
  await decode(nShort);
  const s1 = c.snapshot();
  const result = await decode(nLong);
  const s2 = c.snapshot();
  const perToken = gpuCountersPerToken(gpuCountsDelta(s0, s1), gpuCountsDelta(s1, s2), nShort, nLong);
  return { result, counters_per_token: { ...perToken, decode_tokens: [nShort, nLong] } };
}

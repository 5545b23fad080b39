// Where a decode token's time goes: CPU phases of each decoder run, and GPU time per kernel.
// installGpuTiming(scope) wraps the prototypes of scope's GPU* classes (before onnxruntime-web creates
// its device, like counters.mjs) and watchRun(session) wraps one session's run() (watchRun(steps, 'issue'):
// a captured decode's step, whose logits read-back follows its session.run). Self-contained and
// browser-safe for the same reason as counters.mjs (its source can be prepended to the site's worker):
// no imports, top-level names prefixed.
//
// One decode step, between two onToken stamps of the runtime (asr.js: argmax, then onToken, then the next
// step's inputs and decoder.run), is cut at three points that every step has:
//   stamp(i-1) --pre--> run() entry --issue--> mapAsync() call --wait--> mapAsync resolved --post--> stamp(i)
// pre: the runtime's inputs for the step; issue: JS + onnxruntime's wasm + WebGPU calls until the logits'
// read-back is requested; wait: the read-back; post: the copy out of the mapped buffer, run() returning,
// argmax, onToken. The four add up to the step exactly. Per token = the mean over the steps of one decode:
// every step is stamped on its own, so no short/long difference is needed (that method is for totals that
// cannot be cut per step; on times it subtracts two noisy sums), and means add up where medians do not.
//
// WebGPU call time: every method of the GPU* prototypes (but mapAsync, the boundary) is timed with two
// performance.now() calls; what that adds per call is measured at install (wrapperUsPerCall, ~0.1 µs in
// Node: 0.05 ms on the tiny example's ~400 calls per token).
//
// GPU time: during gpuTimedDecode, each compute pass onnxruntime-web begins is handed back as a recording
// proxy; its end() replays every dispatch into a real pass of its own with timestampWrites (the pass's
// state, pipeline and bind groups, set again in each), then resolves the query set into a buffer in the
// same encoder. The times are read back after the decode (gpuTimedDecode), never inside a step.

/**
 * A global with WebGPU's classes (globalThis, or the worker's `self`), whose prototypes get wrapped.
 * @typedef {object} GpuScope
 * @property {GpuTiming} [__gpuTiming] installGpuTiming's
 * @property {import('./counters.mjs').GpuCounters} [__gpuCounters] counters.mjs's installGpuCounters'
 * @property {{prototype: GPUDevice}} [GPUDevice]
 * @property {{prototype: GPUQueue}} [GPUQueue]
 * @property {{prototype: GPUCommandEncoder}} [GPUCommandEncoder]
 * @property {{prototype: GPUComputePassEncoder}} [GPUComputePassEncoder]
 * @property {{prototype: GPUBuffer}} [GPUBuffer]
 * @property {{prototype: GPUQuerySet}} [GPUQuerySet]
 * @property {typeof GPUBufferUsage} [GPUBufferUsage]
 * @property {typeof GPUMapMode} [GPUMapMode]
 */
/**
 * One watched run() (ms stamps of performance.now()).
 * @typedef {object} RunRecord
 * @property {number} t0 run() entered
 * @property {number} callMs0 the call clock (GpuTiming.callMs) at t0
 * @property {number} calls0 the call count at t0
 * @property {number} [tMap] its first mapAsync() called
 * @property {number} [tMapped] that mapAsync resolved
 * @property {number} t1 run() settled (set then)
 * @property {number} issueCallMs WebGPU call ms from t0 to tMap (set with tMap)
 * @property {number} issueCalls WebGPU calls from t0 to tMap (set with tMap)
 */
/**
 * The timing harness's state (scope.__gpuTiming).
 * @typedef {object} GpuTiming
 * @property {number} callMs time inside the wrapped WebGPU calls since install
 * @property {number} calls their number
 * @property {RunRecord[]} runs
 * @property {RunRecord | null} current the run in progress
 * @property {GPUDevice | null} device the latest command encoder's
 * @property {TimedPass[] | null} passes while GPU-timed: the replayed passes
 * @property {number} wrapperUsPerCall
 * @property {boolean} on
 * @property {(session: object, method?: string) => void} watchRun wraps session[method] (an async function)
 * @property {boolean} [watched] synth_hook.js's: its runs are watched
 */
/** @typedef {{querySet: GPUQuerySet, resolve: GPUBuffer, read: GPUBuffer, names: string[]}} ReplayedPass */
/** @typedef {ReplayedPass & {run: RunRecord | null}} TimedPass */
/** @typedef {{run: RunRecord | null, kernels: [string, number][]}} ReadPass  kernel name and ns, per dispatch */
/** @typedef {{stamps: number[], ids?: number[]}} DecodeResult  stamps: performance.now() at each token; ids: the tokens */
/** @typedef {(n: number) => Promise<DecodeResult>} Decode  n decode steps after the same prompt */
// A recorded compute pass call: the method's name and its arguments, replayed as they came (so untyped).
/** @typedef {[string, ...any[]]} PassCmd */

/**
 * @param {GpuScope} [scope]
 * @param {{on?: boolean}} [opts]
 * @returns {GpuTiming}
 */
export function installGpuTiming(scope = globalThis, { on = true } = {}) {
  if (scope.__gpuTiming) return scope.__gpuTiming;
  const now = () => performance.now();
  const t = /** @type {GpuTiming} */ (/** @type {unknown} */ ({ // on and watchRun are set below
    callMs: 0, calls: 0, // time inside the wrapped WebGPU calls since install, and their number
    runs: [], // one record per watched run(): {t0, tMap, tMapped, t1, issueCallMs, issueCalls}
    current: null, // the record of the run in progress
    device: null, // the device of the latest command encoder: onnxruntime-web's
    passes: null, // while GPU-timed: the replayed passes {read, names, run, ...}
    wrapperUsPerCall: 0,
  }));
  // t.on: a page that benches rounds without timing them installs with {on: false} (two now() calls per
  // WebGPU call are not free in a browser worker) and switches it on for the timed decode only.
  t.on = on;
  /** @type {Timed} */
  const timed = (f, sum = t) => /** @this {unknown} @param {...unknown} args */ function (...args) {
    if (!t.on) return f.apply(this, args);
    const t0 = now();
    try { return f.apply(this, args); } finally { sum.callMs += now() - t0; sum.calls++; }
  };
  for (const cls of /** @type {const} */ (['GPUDevice', 'GPUQueue', 'GPUCommandEncoder', 'GPUComputePassEncoder', 'GPUBuffer', 'GPUQuerySet'])) {
    const proto = /** @type {Record<string, unknown> | undefined} */ (scope[cls]?.prototype);
    for (const m of Object.getOwnPropertyNames(proto ?? {})) {
      const d = Object.getOwnPropertyDescriptor(/** @type {object} */ (proto), m); // proto is there: it has m
      if (m !== 'constructor' && m !== 'mapAsync' && typeof d?.value === 'function') /** @type {Record<string, unknown>} */ (proto)[m] = timed(d.value);
    }
  }
  t.wrapperUsPerCall = gpuTimingWrapperUs(timed);
  gpuTimingBoundary(scope, t, now);
  gpuTimingPasses(scope, t);
  t.watchRun = (session, method = 'run') => gpuTimingWatch(t, session, method, now);
  scope.__gpuTiming = t;
  return t;
}

// What the timing wrap adds to one call, in µs: a wrapped no-op against the bare one, each the best of
// 5 rounds (the least disturbed by the 2-core machine's other work).
/**
 * @typedef {(f: Function, sum?: {callMs: number, calls: number}) => Function} Timed
 *   f wrapped to add its time and calls to sum (the harness's totals by default)
 */
/**
 * @param {Timed} timed
 * @param {number} [n] calls per round
 */
function gpuTimingWrapperUs(timed, n = 50000) {
  const bare = function () {};
  const wrapped = timed(bare, { callMs: 0, calls: 0 });
  /** @param {Function} f */
  const best = (f) => {
    let ms = Infinity;
    for (let r = 0; r < 5; r++) {
      const t0 = performance.now();
      for (let i = 0; i < n; i++) f.call(null, i);
      ms = Math.min(ms, performance.now() - t0);
    }
    return ms;
  };
  return Math.max(0, (best(wrapped) - best(bare)) / n * 1000);
}

// The first mapAsync of a run ends its issue phase; its promise resolving ends the wait. Our `then` is
// attached before the caller's await, so it runs first: the stamp is the resolution, not ORT's reaction.
/**
 * @param {GpuScope} scope
 * @param {GpuTiming} t
 * @param {() => number} now
 */
function gpuTimingBoundary(scope, t, now) {
  const proto = scope.GPUBuffer?.prototype;
  const mapAsync = proto?.mapAsync;
  if (!mapAsync) return;
  /** @type {GPUBuffer} */ (proto).mapAsync = /** @this {GPUBuffer} @param {Parameters<GPUBuffer['mapAsync']>} args */ function (...args) {
    const r = t.current;
    const tCall = now();
    const p = mapAsync.apply(this, args);
    if (r && r.tMap === undefined) {
      Object.assign(r, { tMap: tCall, issueCallMs: t.callMs - r.callMs0, issueCalls: t.calls - r.calls0 });
      p.then(() => { r.tMapped = now(); }, () => {});
    }
    return p;
  };
}

/**
 * @param {GpuTiming} t
 * @param {Record<string, any>} session an InferenceSession or CapturedSteps, whose async `method` is wrapped
 * @param {string} method
 * @param {() => number} now
 */
function gpuTimingWatch(t, session, method, now) {
  const run = session[method];
  session[method] = /** @this {unknown} @param {...unknown} args */ async function (...args) {
    if (!t.on) return run.apply(this, args);
    const r = /** @type {RunRecord} */ ({ t0: now(), callMs0: t.callMs, calls0: t.calls });
    t.runs.push(r);
    t.current = r;
    try {
      return await run.apply(this, args);
    } finally {
      r.t1 = now();
      if (t.current === r) t.current = null;
    }
  };
}

// beginComputePass hands back a recording proxy while t.passes is set (GPU-timed decode only).
/**
 * @param {GpuScope} scope
 * @param {GpuTiming} t
 */
function gpuTimingPasses(scope, t) {
  const enc = scope.GPUCommandEncoder?.prototype;
  const createEncoder = scope.GPUDevice?.prototype.createCommandEncoder;
  if (!enc || !createEncoder) return;
  /** @type {WeakMap<GPUCommandEncoder, GPUDevice>} */
  const devices = new WeakMap(); // GPUCommandEncoder -> its GPUDevice
  /** @type {{prototype: GPUDevice}} */ (scope.GPUDevice).prototype.createCommandEncoder = function (...args) {
    const e = createEncoder.apply(this, args);
    devices.set(e, this);
    t.device = this;
    return e;
  };
  const begin = enc.beginComputePass;
  enc.beginComputePass = function (desc) {
    const device = devices.get(this);
    if (!t.passes || desc?.timestampWrites || !device) return begin.call(this, desc);
    // the stand-in has the methods onnxruntime-web calls on a compute pass
    return /** @type {GPUComputePassEncoder} */ (/** @type {unknown} */ (gpuRecordingPass((cmds) => {
      const pass = gpuReplayTimed(scope, device, this, begin, desc, cmds);
      if (pass) t.passes?.push({ ...pass, run: t.current });
    }, desc)));
  };
}

// A stand-in for a GPUComputePassEncoder that records the calls and hands them to onEnd(cmds) at end().
// Debug groups and markers are dropped: they do not change what runs. Dynamic offsets are copied (the
// caller may pass a view of its wasm memory, reused by the time the pass is replayed).
/**
 * @param {(cmds: PassCmd[]) => void} onEnd
 * @param {GPUComputePassDescriptor} [desc]
 */
export function gpuRecordingPass(onEnd, desc) {
  /** @type {PassCmd[]} */
  const cmds = [];
  /** @param {string} op */
  const rec = (op) => /** @param {...unknown} args */ (...args) => { cmds.push([op, ...args]); };
  return {
    label: desc?.label ?? '',
    setPipeline: rec('setPipeline'),
    /**
     * @param {number} index
     * @param {GPUBindGroup | null} group
     * @param {Uint32Array | number[]} [offsets] the dynamic offsets
     * @param {number} [start] with length: the offsets are offsets[start, start + length) of a Uint32Array
     * @param {number} [length]
     */
    setBindGroup(index, group, offsets, start, length) {
      const o = offsets && (start !== undefined ? Array.from(offsets.slice(start, start + /** @type {number} */ (length))) : Array.from(offsets));
      cmds.push(o?.length ? ['setBindGroup', index, group, o] : ['setBindGroup', index, group]);
    },
    dispatchWorkgroups: rec('dispatchWorkgroups'),
    dispatchWorkgroupsIndirect: rec('dispatchWorkgroupsIndirect'),
    pushDebugGroup() {}, popDebugGroup() {}, insertDebugMarker() {},
    end() { onEnd(cmds); },
  };
}

// Each dispatch of `cmds` as its own pass on `open(i)`'s pass, with the pipeline and bind groups set
// before it; returns the pipelines, one per dispatch, in order.
/**
 * @param {PassCmd[]} cmds
 * @param {(i: number) => GPUComputePassEncoder} open
 * @returns {(GPUComputePipeline | null)[]}
 */
export function gpuReplay(cmds, open) {
  /** @type {GPUComputePipeline | null} */
  let pipeline = null;
  /** @type {Map<number, any[]>} */
  const groups = new Map(); // index -> setBindGroup's arguments
  /** @type {(GPUComputePipeline | null)[]} */
  const pipelines = [];
  for (const [op, ...args] of cmds) {
    if (op === 'setPipeline') pipeline = args[0];
    else if (op === 'setBindGroup') groups.set(args[0], args);
    else {
      const pass = open(pipelines.length);
      if (pipeline) pass.setPipeline(pipeline);
      for (const g of groups.values()) /** @type {Function} */ (pass.setBindGroup).apply(pass, g);
      /** @type {any} */ (pass)[op](...args); // a dispatch method
      pass.end();
      pipelines.push(pipeline);
    }
  }
  return pipelines;
}

// gpuReplay into `encoder` with a begin and end timestamp around each dispatch, resolved into a buffer
// to read after the decode. null for a pass without dispatches.
/**
 * @param {GpuScope} scope
 * @param {GPUDevice} device
 * @param {GPUCommandEncoder} encoder
 * @param {GPUCommandEncoder['beginComputePass']} begin the unwrapped beginComputePass
 * @param {GPUComputePassDescriptor | undefined} desc
 * @param {PassCmd[]} cmds
 * @returns {ReplayedPass | null}
 */
function gpuReplayTimed(scope, device, encoder, begin, desc, cmds) {
  const n = cmds.filter(([op]) => op.startsWith('dispatch')).length;
  if (!n) return null;
  if (n > 2048) throw new Error(`${n} dispatches in one compute pass: more than one query set (4096 queries) holds`);
  const querySet = device.createQuerySet({ type: 'timestamp', count: 2 * n });
  const pipelines = gpuReplay(cmds, (i) => begin.call(encoder, {
    ...desc, timestampWrites: { querySet, beginningOfPassWriteIndex: 2 * i, endOfPassWriteIndex: 2 * i + 1 },
  }));
  const U = /** @type {typeof GPUBufferUsage} */ (scope.GPUBufferUsage); // there wherever a device is
  const resolve = device.createBuffer({ size: 16 * n, usage: U.QUERY_RESOLVE | U.COPY_SRC });
  const read = device.createBuffer({ size: 16 * n, usage: U.MAP_READ | U.COPY_DST });
  encoder.resolveQuerySet(querySet, 0, 2 * n, resolve, 0);
  encoder.copyBufferToBuffer(resolve, 0, read, 0, 16 * n);
  /** @param {GPUComputePipeline | null} p */
  const name = (p) => scope.__gpuCounters?.pipelineName(p) ?? p?.label ?? '(unnamed)';
  return { querySet, resolve, read, names: pipelines.map(name) };
}

// Kernel ns of each replayed pass, read back (after the decode), then the GPU objects destroyed.
/**
 * @param {GpuScope} scope
 * @param {TimedPass[]} passes
 * @returns {Promise<ReadPass[]>}
 */
async function gpuReadPasses(scope, passes) {
  await Promise.all(passes.map((p) => p.read.mapAsync(scope.GPUMapMode?.READ ?? 1)));
  return passes.map((p) => {
    const ts = new BigUint64Array(p.read.getMappedRange().slice(0));
    for (const o of [p.read, p.resolve, p.querySet]) o.destroy();
    return { run: p.run, kernels: p.names.map((k, i) => /** @type {[string, number]} */ ([k, Number(ts[2 * i + 1] - ts[2 * i])])) };
  });
}

// The runs of one decode: those begun between its first and last onToken stamp, one per step.
/**
 * @param {RunRecord[]} runs
 * @param {number[]} stamps
 */
export function gpuDecodeRuns(runs, stamps) {
  const out = runs.filter((r) => r.t0 > stamps[0] && r.t0 < stamps[stamps.length - 1]);
  if (out.length !== stamps.length - 1) throw new Error(`${out.length} decoder runs for ${stamps.length - 1} decode steps`);
  return out;
}

/** @param {number} v @param {number} [d] decimals */
const gpuRound = (v, d = 3) => Math.round(v * 10 ** d) / 10 ** d;

// The CPU phases of a decode, ms per token (means over its steps; see the top of this file).
/**
 * @param {RunRecord[]} runs
 * @param {number[]} stamps
 * @param {number} wrapperUsPerCall
 */
export function gpuCpuPerToken(runs, stamps, wrapperUsPerCall) {
  const steps = gpuDecodeRuns(runs, stamps).map((r, i) => {
    if (r.tMap === undefined || r.tMapped === undefined) throw new Error('a decode step without a read-back (mapAsync)');
    return { pre: r.t0 - stamps[i], issue: r.tMap - r.t0, wait: r.tMapped - r.tMap, post: stamps[i + 1] - r.tMapped,
      postInRun: r.t1 - r.tMapped, calls: r.issueCallMs, n: r.issueCalls };
  });
  /** @param {keyof typeof steps[number]} k */
  const mean = (k) => steps.reduce((s, x) => s + x[k], 0) / steps.length;
  return {
    wall_ms: gpuRound(mean('pre') + mean('issue') + mean('wait') + mean('post')), pre_ms: gpuRound(mean('pre')),
    issue_cpu_ms: gpuRound(mean('issue')), webgpu_call_ms: gpuRound(mean('calls')), webgpu_calls: gpuRound(mean('n'), 1),
    wrapper_us_per_call: gpuRound(wrapperUsPerCall), readback_wait_ms: gpuRound(mean('wait')),
    post_ms: gpuRound(mean('post')), post_in_run_ms: gpuRound(mean('postInRun')), steps: steps.length,
    // a step issued before the previous token was out (the captured decode queues steps ahead): the
    // phases overlap, and only wall and issue keep their meaning
    pipelined: steps.some((x) => x.pre < 0),
  };
}

// GPU ms per token of the decode runs: the sum and per kernel (most first).
/**
 * @param {ReadPass[]} passes
 * @param {RunRecord[]} decodeRuns
 */
export function gpuKernelsPerToken(passes, decodeRuns) {
  /** @type {Set<RunRecord | null>} */
  const inDecode = new Set(decodeRuns);
  /** @type {Record<string, number>} */
  const kernels = {};
  for (const p of passes) {
    if (!inDecode.has(p.run)) continue;
    for (const [k, ns] of p.kernels) kernels[k] = (kernels[k] ?? 0) + ns;
  }
  const perToken = Object.entries(kernels)
    .map(([k, ns]) => /** @type {[string, number]} */ ([k, ns / 1e6 / decodeRuns.length])).sort((a, b) => b[1] - a[1]);
  return {
    gpu_ms: gpuRound(perToken.reduce((s, [, ms]) => s + ms, 0), 4),
    kernels_gpu_ms: Object.fromEntries(perToken.map(([k, ms]) => [k, gpuRound(ms, 4)])),
  };
}

// decode(n) -> {stamps, ids} runs n decode steps (the same prompt and tokens each time). Runs it once
// more with every dispatch timestamped and returns {gpu_timing, gpu_ms, kernels_gpu_ms, gpu_timed_wall_ms}, or
// {gpu_timing: 'unavailable: <why>'}. `ids`: the untimed decode's token ids, which the timed one must
// repeat (the replayed passes must compute what the recorded ones would have).
/**
 * @param {Decode} decode
 * @param {number} n
 * @param {number[] | undefined} ids
 * @param {GpuScope} [scope]
 */
export async function gpuTimedDecode(decode, n, ids, scope = globalThis) {
  const t = scope.__gpuTiming;
  if (!t?.device) return { gpu_timing: 'unavailable: no WebGPU device made a command encoder' };
  if (!t.device.features.has('timestamp-query')) {
    return { gpu_timing: "unavailable: onnxruntime-web's device has no timestamp-query feature" };
  }
  t.passes = [];
  let r, passes;
  try {
    r = await decode(n);
  } finally {
    passes = t.passes;
    t.passes = null;
  }
  const read = await gpuReadPasses(scope, passes);
  if (ids && JSON.stringify(r.ids) !== JSON.stringify(ids)) {
    return { gpu_timing: 'unavailable: the timestamped replay changed the decoded tokens' };
  }
  // the timed decode's own ms per token: the replay's extra passes and query sets slow it down
  const wall = (r.stamps[r.stamps.length - 1] - r.stamps[0]) / (r.stamps.length - 1);
  return { gpu_timing: 'timestamp-query', ...gpuKernelsPerToken(read, gpuDecodeRuns(t.runs, r.stamps)),
    gpu_timed_wall_ms: gpuRound(wall) };
}

// timing_per_token of the report: the CPU phases of `result` (a decode's {stamps, ids}, runs watched), then
// the GPU-timed decode of as many steps. null without a watched run (the wasm EP, or no timing installed).
/**
 * @param {Decode} decode
 * @param {DecodeResult} result
 * @param {GpuScope} [scope]
 */
export async function gpuTimingPerToken(decode, result, scope = globalThis) {
  const t = scope.__gpuTiming;
  if (!t || !t.runs.length || result.stamps.length < 2) return null;
  const cpu = gpuCpuPerToken(t.runs, result.stamps, t.wrapperUsPerCall);
  /** @type {{gpu_timing: string, gpu_ms?: number}} */
  const gpu = await gpuTimedDecode(decode, result.stamps.length - 1, result.ids, scope);
  if (gpu.gpu_ms === undefined) return { ...cpu, ...gpu };
  // A token takes at least the larger of its CPU work (every phase but the wait; the issue alone when the
  // steps are queued ahead) and its GPU work (which overlaps the issue: onnxruntime-web submits as it goes);
  // that one bounds it.
  const cpuMs = cpu.pipelined ? cpu.issue_cpu_ms : cpu.wall_ms - cpu.readback_wait_ms;
  return { ...cpu, ...gpu, bound: gpu.gpu_ms > cpuMs ? 'gpu' : 'cpu' };
}

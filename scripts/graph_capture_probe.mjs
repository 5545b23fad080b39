// Graph capture probe: onnxruntime-web's `enableGraphCapture` on a static-KV decoder (the
// onnxruntime-genai builder's graph made with enable_webgpu_graph=true), on Dawn in Node.
// Every input and output is a GPU tensor of one fixed shape for all steps: past/present KV share one
// buffer of --max positions per layer (GroupQueryAttention reads and writes it in place), the
// attention mask is [1, --max] with ones up to the current position. Tokens are fed one per run
// (greedy: the argmax of a step's logits is the next step's token), so every run has identical shapes.
// Prints, per run, the WebGPU calls made inside session.run (createBindGroup, writeBuffer,
// dispatchWorkgroups, submit, createBuffer, mapAsync), whether the outputs came back on the buffers
// passed in, and the chosen token; the reads of logits and the probe's own writes (embedding, mask)
// happen outside session.run and are not counted. A failing run prints the error, the kernels it
// dispatched and its last createBindGroup (program + entries: an undefined entry is a dead handle).
//
//   node scripts/graph_capture_probe.mjs MODEL [EMBED_BIN] [--capture 1] [--ep device|object|string|extra]
//        [--steps 6] [--max 64] [--ort DIR] [--pin 1] [--json FILE]
// docs/graph-capture.md has the commands and the results.
import { stat, writeFile } from 'node:fs/promises';
import path from 'node:path';

import { gpuCountsDelta } from '../webbuild/tools/bench/counters.mjs';
import { fileBytes, openOrt, ORT_DIST } from '../webbuild/tools/bench/ort.mjs';

const o = { capture: 0, ep: 'device', steps: 6, max: 64, ort: ORT_DIST, pin: 0, json: '' };
const pos = [];
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  const k = argv[i].startsWith('--') ? argv[i].slice(2) : null;
  if (k && k in o) o[k] = typeof o[k] === 'number' ? Number(argv[++i]) : argv[++i];
  else if (!k) pos.push(argv[i]);
  else throw new Error(`unknown argument ${argv[i]}`);
}
// MODEL: a folder holding model.onnx (+ genai_config.json), or an .onnx file; its external data is
// MODEL.data. EMBED_BIN (float32 [vocab, hidden]) only for graphs that take inputs_embeds.
const [modelArg, embedPath] = pos;
if (o.steps > o.max) throw new Error(`--steps ${o.steps} > --max ${o.max}: the KV buffers hold --max positions`);
if (!modelArg) throw new Error('usage: graph_capture_probe.mjs MODEL [EMBED_BIN] [--capture 1] [--ep device|object|string|extra] ...');
const modelFile = (await stat(modelArg)).isDirectory() ? path.join(modelArg, 'model.onnx') : modelArg;
const dir = path.dirname(modelFile);
const modelName = path.basename(modelFile);

const { ort, adapter } = await openOrt({ ep: 'webgpu', ort: path.resolve(o.ort) });
const counters = globalThis.__gpuCounters;
// Which program a bind group is for: layouts come from pipeline.getBindGroupLayout, so name them
// after their pipeline; the last createBindGroup call's program is where a failing run stopped.
const layoutOf = new WeakMap();
let lastBindGroup = null;
const getLayout = GPUComputePipeline.prototype.getBindGroupLayout;
GPUComputePipeline.prototype.getBindGroupLayout = function (i) {
  const l = getLayout.call(this, i);
  layoutOf.set(l, this.label);
  return l;
};
// --pin 1, the workaround: onnxruntime-web binds the inputs/outputs once (first run) when
// enableGraphCapture is on, but unregisters every GPU buffer at the end of each run, so the bound
// tensors keep handles that no longer name a buffer (or name another one). Pinning takes one extra
// reference on each buffer's registration during the first run (at its first createBindGroup, when
// they are registered), so the handles the binding holds stay valid. The registration lives on the
// GPUBuffer under onnxruntime-web's private symbol 'gpuBufferMetadata' as [handle, refcount].
let pinPending = false;
const pinned = [];
const pinBuffers = () => {
  for (const b of pinned) {
    const sym = Object.getOwnPropertySymbols(b).find((x) => x.description === 'gpuBufferMetadata');
    if (!sym) throw new Error('--pin: buffer not registered during the first run');
    b[sym][1]++;
  }
};
const createBindGroup = GPUDevice.prototype.createBindGroup;
GPUDevice.prototype.createBindGroup = function (desc) {
  if (pinPending) { pinPending = false; pinBuffers(); }
  lastBindGroup = { program: layoutOf.get(desc.layout) ?? desc.layout?.label, entries: desc.entries.map((e) => { const b = e.resource instanceof GPUBuffer ? e.resource : e.resource?.buffer; return b instanceof GPUBuffer ? `buffer ${b.size}` : String(b); }) };
  return createBindGroup.call(this, desc);
};
// How the WebGPU EP is named (--ep):
//   device  { name: 'webgpu', device }: our own GPUDevice, so our buffers live on it
//   object  { name: 'webgpu' }: onnxruntime-web makes the device and publishes it as env.webgpu.device
//   string  'webgpu': the same, named by a string (onnxruntime-web then drops enableGraphCapture)
//   extra   'webgpu' plus the EP's own key as a session config entry (extra), which comes too late
const limits = ['maxComputeWorkgroupStorageSize', 'maxStorageBufferBindingSize', 'maxBufferSize',
  'maxComputeInvocationsPerWorkgroup', 'maxComputeWorkgroupSizeX', 'maxStorageBuffersPerShaderStage'];
const myDevice = o.ep === 'device'
  ? await adapter.requestDevice({ requiredFeatures: [...adapter.features], requiredLimits: Object.fromEntries(limits.map((k) => [k, adapter.limits[k]])) })
  : null;
const ep = { device: { name: 'webgpu', device: myDevice }, object: { name: 'webgpu' }, string: 'webgpu', extra: 'webgpu' }[o.ep];
if (!ep) throw new Error(`--ep wants device, object, string or extra, got ${o.ep}`);
const session = await ort.InferenceSession.create(await fileBytes(dir, modelName), {
  executionProviders: [ep],
  enableGraphCapture: !!o.capture,
  preferredOutputLocation: 'gpu-buffer',
  externalData: [{ path: `${modelName}.data`, data: await fileBytes(dir, `${modelName}.data`) }],
  ...(o.ep === 'extra' ? { extra: { 'ep.webgpuexecutionprovider.enableGraphCapture': o.capture ? '1' : '0' } } : {}),
}).catch(async (e) => {
  // a graph the EP cannot capture is refused here (e.g. nodes left on the CPU EP)
  const message = String(e?.message ?? e).replace(/\s+/g, ' ');
  console.log(`session creation failed: ${message}`);
  if (o.json) await writeFile(o.json, JSON.stringify({ ep: o.ep, capture: !!o.capture, error: { step: 'create', message } }, null, 1));
  process.exit(0);
});
const device = myDevice ?? await ort.env.webgpu.device;
const meta = Object.fromEntries([...session.inputMetadata, ...session.outputMetadata].map((m) => [m.name, m]));
const vocab = meta.logits.shape[2];
// genai's graph leaves the KV head size symbolic: take it from genai_config.json where there is one
const cfg = await fileBytes(dir, 'genai_config.json').then((b) => JSON.parse(new TextDecoder().decode(b)).model.decoder, () => null);
const pastMeta = meta['past_key_values.0.key'].shape;
const kvShape = () => [1, cfg?.num_key_value_heads ?? pastMeta[1], o.max, cfg?.head_size ?? pastMeta[3]];
const hidden = (meta.inputs_embeds ?? meta.audio_features)?.shape[2];
const embed = meta.inputs_embeds ? new Float32Array((await fileBytes(path.dirname(embedPath), path.basename(embedPath))).slice().buffer) : null;
if (embed && embed.length !== vocab * hidden) throw new Error(`embedding table ${embed.length} != ${vocab} x ${hidden}`);

const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
const bytesOf = { float32: 4, int64: 8 };
const gpuTensor = (type, dims) => {
  const size = dims.reduce((a, b) => a * b, 1) * bytesOf[type];
  const buffer = device.createBuffer({ size: Math.ceil(size / 16) * 16, usage });
  return { buffer, tensor: ort.Tensor.fromGpuBuffer(buffer, { dataType: type, dims }) };
};
// One buffer per name for the whole decode: what a captured graph needs (same addresses every run).
const mask = gpuTensor('int64', [1, o.max]);
const logits = gpuTensor('float32', [1, 1, vocab]);
const feeds = { attention_mask: mask.tensor };
// the token goes in as its embedding (genai, exclude_embeds) or as its id (webbuild's decoder, which
// also takes audio_features + audio_offset: one zero row that no position reaches)
const emb = embed ? gpuTensor('float32', [1, 1, hidden]) : gpuTensor('int64', [1, 1]);
feeds[embed ? 'inputs_embeds' : 'input_ids'] = emb.tensor;
if (meta.audio_features) {
  const audio = gpuTensor('float32', [1, 1, hidden]);
  device.queue.writeBuffer(audio.buffer, 0, new Float32Array(hidden));
  const offset = gpuTensor('int64', [1]);
  device.queue.writeBuffer(offset.buffer, 0, BigInt64Array.of(1n << 30n));
  Object.assign(feeds, { audio_features: audio.tensor, audio_offset: offset.tensor });
}
const fetches = { logits: logits.tensor };
for (const n of session.inputNames.filter((x) => x.startsWith('past_key_values'))) {
  const kv = gpuTensor('float32', kvShape());
  device.queue.writeBuffer(kv.buffer, 0, new Float32Array(kv.buffer.size / 4)); // zeros
  feeds[n] = kv.tensor;
  fetches[n.replace('past_key_values', 'present')] = kv.tensor; // past and present share the buffer
}
for (const n of session.inputNames) if (!(n in feeds)) throw new Error(`input ${n} not fed`);
if (o.pin) pinned.push(...new Set([...Object.values(feeds), ...Object.values(fetches)].map((t) => t.gpuBuffer)));

const readLogits = async () => {
  const staging = device.createBuffer({ size: logits.buffer.size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  const enc = device.createCommandEncoder();
  enc.copyBufferToBuffer(logits.buffer, 0, staging, 0, logits.buffer.size);
  device.queue.submit([enc.finish()]);
  await staging.mapAsync(GPUMapMode.READ);
  const v = new Float32Array(staging.getMappedRange().slice(0, vocab * 4));
  staging.destroy();
  return v;
};
const argmax = (v) => v.reduce((best, x, i) => (x > v[best] ? i : best), 0);

const runs = [];
const logitsPerStep = []; // kept in --json, to compare a captured run's logits with an uncaptured one's
let token = 1;
let error = null;
for (let step = 0; step < o.steps; step++) {
  const t0 = performance.now(); // a step: its inputs written, session.run, the logits read, argmax
  if (embed) device.queue.writeBuffer(emb.buffer, 0, embed, token * hidden, hidden);
  else device.queue.writeBuffer(emb.buffer, 0, BigInt64Array.of(BigInt(token)));
  const m = new BigInt64Array(o.max);
  m.fill(1n, 0, step + 1); // positions 0..step are valid, the rest of the static buffer is padding
  device.queue.writeBuffer(mask.buffer, 0, m);
  pinPending = o.pin && step === 0;
  const s0 = counters.snapshot();
  let out;
  try {
    out = await session.run(feeds, fetches);
  } catch (e) {
    const d = gpuCountsDelta(s0, counters.snapshot());
    // the kernels that ran before the failure, and the one whose bind group failed (the last set)
    error = { step, message: String(e?.message ?? e).replace(/\s+/g, ' '), kernels: d.kernels, failed_in: lastBindGroup };
    runs.push({ step, ...pick(d), error: error.message });
    break;
  }
  const delta = gpuCountsDelta(s0, counters.snapshot());
  const c = { ...pick(delta), kernels: delta.kernels };
  // did session.run hand back the buffers it was given? (false: it made outputs of other buffers)
  c.same_outputs = Object.entries(fetches).every(([k, t]) => out[k]?.gpuBuffer === t.gpuBuffer);
  const v = await readLogits();
  logitsPerStep.push(Array.from(v));
  token = argmax(v);
  runs.push({ step, ...c, ms: Number((performance.now() - t0).toFixed(3)), token, logit: Number(v[token].toFixed(5)), checksum: Number(v.reduce((a, x) => a + x, 0).toFixed(4)) });
}
function pick(d) {
  return { bind_groups: d.bind_groups, write_buffers: d.write_buffers, dispatches: d.dispatches, submits: d.submits, buffers: d.buffers, readbacks: d.readbacks };
}

// ms per token: the median step after the first two (run 0 records the capture, run 1 is the first replay)
const later = runs.slice(2).filter((r) => !r.error).map((r) => r.ms).sort((a, b) => a - b);
const msPerToken = later.length ? later[Math.floor((later.length - 1) / 2)] : null;
const result = { ort: ort.env.versions?.web ?? o.ort, ep: o.ep, capture: !!o.capture, pin: !!o.pin, max: o.max, runs, error,
  ms_per_token: msPerToken, tokens: runs.map((r) => r.token), logits: logitsPerStep };
console.log(`onnxruntime-web ${result.ort}, ep ${o.ep}, enableGraphCapture ${!!o.capture}, pin ${!!o.pin}, max ${o.max}`);
console.log('step bind_groups write_buffers dispatches submits buffers readbacks same_outputs ms token');
for (const r of runs) console.log([r.step, r.bind_groups, r.write_buffers, r.dispatches, r.submits, r.buffers, r.readbacks, r.same_outputs ?? '-', r.ms ?? '-', r.error ? `ERROR ${r.error}` : r.token].join(' '));
console.log(`ms per token (median of steps 2..): ${msPerToken}`);
if (error) console.log(`error at step ${error.step}: ${error.message}\nkernels dispatched in that run: ${JSON.stringify(error.kernels)}\nlast createBindGroup: ${JSON.stringify(error.failed_in)}`);
if (o.json) await writeFile(o.json, JSON.stringify(result, null, 1));
process.exit(0);

// Probe (scripts/shared_weights_probe.py says how to run it): the captured step graph with its weights as graph
// inputs (capture.js extraFeeds), against the graph as built: the tokens of 6 steps after a 40-token prompt.
import { readFile } from 'node:fs/promises';
import { openOrt } from '../webbuild/tools/bench/ort.mjs';
import { CapturedSteps } from '../webbuild/template/runtime/capture.js';

const dir = '/tmp/ws';
const o = { ep: 'webgpu', ort: undefined };
const { ort } = await openOrt({ ep: 'webgpu', ort: (await import('../webbuild/tools/bench/ort.mjs')).ORT_DIST });
const bytes = async (n) => new Uint8Array(await readFile(`${dir}/${n}`));
const data = await bytes('decoder.fp32.onnx.data');
const counters = globalThis.__gpuCounters;
const opts = { executionProviders: ['webgpu'], logSeverityLevel: 3 };

const t0 = performance.now();
const base = await ort.InferenceSession.create(await bytes('decoder.fp32.onnx'),
  { ...opts, externalData: [{ path: 'decoder.fp32.onnx.data', data }] });
const t1 = performance.now();
const ws = await ort.InferenceSession.create(await bytes('decoder.fp32.ws.onnx'), opts);
const t2 = performance.now();
console.log('session ms: initializers', (t1 - t0).toFixed(0), 'inputs', (t2 - t1).toFixed(0));
const device = await ort.env.webgpu.device;
const TYPES = { 1: 'float32', 2: 'uint8', 3: 'int8', 6: 'int32', 7: 'int64', 10: 'float16' };
const weights = {};
for (const w of JSON.parse(await readFile(`${dir}/decoder.fp32.ws.onnx.json`, 'utf8'))) {
  const size = Math.ceil(w.length / 16) * 16;
  const buf = device.createBuffer({ size, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST });
  const src = new Uint8Array(size); src.set(data.subarray(w.offset, w.offset + w.length));
  device.queue.writeBuffer(buf, 0, src);
  weights[w.name] = ort.Tensor.fromGpuBuffer(buf, { dataType: TYPES[w.dtype], dims: w.dims });
}
console.log('weights', Object.keys(weights).length);
// feeds: every other input of the base session, zeros / small ids
const feeds = {};
const inputs = base.inputNames;
console.log('inputs', inputs.slice(0, 12), base.inputMetadata ? '' : '');
for (const meta of base.inputMetadata ?? []) console.log(meta.name, meta.type, meta.shape);


const rt = JSON.parse(await readFile(`${dir}/runtime.json`, 'utf8'));
const L = 40, A = 30;
const ids = BigInt64Array.from({ length: L }, (_, i) => BigInt((i * 37 + 5) % 2000));
const audio = Float32Array.from({ length: A * 256 }, (_, i) => Math.sin(i * 0.37) * 0.5);
const presentNames = []; for (let l = 0; l < 4; l++) for (const kv of ['key', 'value']) presentNames.push(`present.${l}.${kv}`);
const prefillSession = await ort.InferenceSession.create(await bytes('decoder.fp32.onnx'),
  { ...opts, externalData: [{ path: 'decoder.fp32.onnx.data', data }], preferredOutputLocation: Object.fromEntries(presentNames.map((n) => [n, 'gpu-buffer'])) });
async function prefill() {
  const f = {
    input_ids: new ort.Tensor('int64', ids, [1, L]),
    audio_features: new ort.Tensor('float32', audio, [1, A, 256]),
    audio_offset: new ort.Tensor('int64', BigInt64Array.from([3n]), [1]),
    attention_mask: new ort.Tensor('int64', new BigInt64Array(L).fill(1n), [1, L]),
  };
  for (let l = 0; l < 4; l++) for (const kv of ['key', 'value']) f[`past_key_values.${l}.${kv}`] = new ort.Tensor('float32', new Float32Array(0), [1, 2, 0, 64]);
  const out = await prefillSession.run(f);
  const logits = await out.logits.getData();
  let best = 0; for (let i = L * 2055 - 2055; i < L * 2055; i++) if (logits[i] > logits[L * 2055 - 2055 + best]) best = i - (L * 2055 - 2055);
  const present = {}; for (let l = 0; l < 4; l++) for (const kv of ['key', 'value']) present[`past_key_values.${l}.${kv}`] = out[`present.${l}.${kv}`];
  return { present, token: best };
}
async function decode(steps, n) {
  const { present, token } = await prefill();
  steps.begin(present, L, token);
  const tokens = [token]; const times = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    const { pick } = await steps.issue(L + 1 + i);
    const p = await pick; times.push(performance.now() - t);
    tokens.push(p.token);
  }
  return { tokens, times: times.map((x) => x.toFixed(0)).join(' ') };
}
const provider = { name: 'webgpu' };
const t3 = performance.now();
const baseSteps = await CapturedSteps.create(ort, provider, await bytes('decoder.fp32.step.onnx'),
  [{ path: 'decoder.fp32.onnx.data', data }], rt.decoder, rt.io, rt.max_positions, 'float32', { options: { logSeverityLevel: 3 } });
const t4 = performance.now();
const wsSteps = await CapturedSteps.create(ort, provider, await bytes('decoder.fp32.step.ws.onnx'), undefined,
  rt.decoder, rt.io, rt.max_positions, 'float32', { options: { logSeverityLevel: 3 },
    extraFeeds: (names) => Object.fromEntries(names.filter((n) => n in weights).map((n) => [n, weights[n]])) });
const t5 = performance.now();
console.log('step session ms: initializers', (t4 - t3).toFixed(0), 'inputs', (t5 - t4).toFixed(0));
const a = await decode(baseSteps, 6);
console.log('captured, initializers', a.tokens.join(','), 'ms', a.times);
const b = await decode(wsSteps, 6);
console.log('captured, weight inputs', b.tokens.join(','), 'ms', b.times);
const a2 = await decode(baseSteps, 6);
console.log('captured, initializers again', a2.tokens.join(','), 'ms', a2.times);
process.exit(0);

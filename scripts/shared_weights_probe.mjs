// Probe (scripts/shared_weights_probe.py says how to run it): the decoder's prefill graph with its weights as graph
// inputs, fed from GPU buffers written once, against the graph as built (weights as initializers): kernels, logits.
import { readFile } from 'node:fs/promises';
import { openOrt } from '../webbuild/tools/bench/ort.mjs';
import { installGpuCounters } from '../webbuild/tools/bench/counters.mjs';

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

const L = 40, A = 30;
const ids = BigInt64Array.from({ length: L }, (_, i) => BigInt((i * 37 + 5) % 2000));
const audio = Float32Array.from({ length: A * 256 }, (_, i) => Math.sin(i * 0.37) * 0.5);
const mk = () => {
  const f = {
    input_ids: new ort.Tensor('int64', ids, [1, L]),
    audio_features: new ort.Tensor('float32', audio, [1, A, 256]),
    audio_offset: new ort.Tensor('int64', BigInt64Array.from([3n]), [1]),
    attention_mask: new ort.Tensor('int64', new BigInt64Array(L).fill(1n), [1, L]),
  };
  for (let l = 0; l < 4; l++) for (const kv of ['key', 'value']) f[`past_key_values.${l}.${kv}`] = new ort.Tensor('float32', new Float32Array(0), [1, 2, 0, 64]);
  return f;
};
const c = globalThis.__gpuCounters;
async function run(session, extra, label) {
  const times = [];
  let out, k0, k1;
  for (let i = 0; i < 4; i++) {
    k0 = c.snapshot();
    const t = performance.now();
    out = await session.run({ ...mk(), ...extra });
    const logits = await out.logits.getData();
    times.push(performance.now() - t);
    k1 = c.snapshot();
    if (i < 3) for (const v of Object.values(out)) v.dispose?.();
    if (i === 3) out.logitsData = logits;
  }
  const kernels = {};
  for (const [k, v] of Object.entries(k1.kernels)) if (v - (k0.kernels[k] ?? 0)) kernels[k] = v - (k0.kernels[k] ?? 0);
  console.log(label, 'ms per run', times.map((t) => t.toFixed(0)).join(' '), 'dispatches', k1.dispatches - k0.dispatches, JSON.stringify(kernels));
  return out.logitsData;
}
const a = await run(base, {}, 'initializers');
const b = await run(ws, weights, 'inputs');
let maxd = 0; for (let i = 0; i < a.length; i++) maxd = Math.max(maxd, Math.abs(a[i] - b[i]));
console.log('logits', a.length, 'max abs diff', maxd);
process.exit(0);

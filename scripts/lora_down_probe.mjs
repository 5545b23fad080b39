// Time per run of scripts/lora_down_probe.py's graphs on WebGPU (Node + Dawn): the adapter matrices and the
// base outputs as GPU-buffer inputs made once, x fed from the CPU, y read back; dispatches per run counted. Rounds
// alternate the graphs in one process (ABC, CBA, ...). Prints the phases as JSON.
//   node scripts/lora_down_probe.mjs DIR [RUNS 100] [ROUNDS 4] [KIND,KIND...]
import { readFileSync, readdirSync } from 'node:fs';
import { installDawn } from '../webbuild/tools/bench/dawn.mjs';
import { importOrt } from '../webbuild/tools/bench/ort.mjs';
import { quantile } from '../webbuild/tools/bench/stats.mjs';

installDawn();
const ort = await importOrt();
const dir = process.argv[2], runs = Number(process.argv[3] ?? 100), rounds = Number(process.argv[4] ?? 4);
let KINDS = process.argv[5]?.split(',') ??
  readdirSync(dir).filter((f) => f.startsWith('lora_') && f.endsWith('.onnx')).map((f) => f.slice(5, -5)).sort();
const sessions = {};
let device;
for (const kind of [...KINDS]) {
  let s;
  try {
    s = await ort.InferenceSession.create(readFileSync(`${dir}/lora_${kind}.onnx`), { executionProviders: ['webgpu'],
      graphOptimizationLevel: 'all', logSeverityLevel: 3 });
  } catch (e) {
    console.error(`${kind}: not run: ${String(e).slice(0, 300)}`);
    KINDS.splice(KINDS.indexOf(kind), 1);
    continue;
  }
  device ??= await ort.env.webgpu.device;
  const feeds = {};
  for (const name of s.inputNames) {
    if (name === 'x') continue;
    const meta = s.inputMetadata.find((m) => m.name === name);
    const dims = meta.shape; const n = dims.reduce((a, b) => a * b, 1);
    const isQ = name.endsWith('.q');
    if (dims.some((d) => typeof d !== 'number')) throw new Error(`${kind}: ${name} has dims ${dims}`);
    const data = isQ ? Uint8Array.from({ length: n }, () => 120 + Math.floor(Math.random() * 16))
      : Float32Array.from({ length: n }, () => (Math.random() - 0.5) * (name.endsWith('.s') ? 0.01 : 0.05));
    const size = Math.ceil(data.byteLength / 16) * 16;
    const buf = device.createBuffer({ size, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC });
    device.queue.writeBuffer(buf, 0, data);
    feeds[name] = ort.Tensor.fromGpuBuffer(buf, { dataType: isQ ? 'uint8' : 'float32', dims });
  }
  sessions[kind] = { s, feeds };
}
const xs = Float32Array.from({ length: 1024 }, () => Math.random() - 0.5);
const X = Object.fromEntries(KINDS.map((k) => [k, new ort.Tensor('float32', xs, [1, 1024])]));
const time = async (kind, n) => {
  const { s, feeds } = sessions[kind];
  const ts = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    const out = await s.run({ ...feeds, x: X[kind] });
    ts.push(performance.now() - t0);
    if (!Number.isFinite(out.y.data[0])) throw new Error(`${kind}: not finite`);
  }
  return { median: quantile(ts, 0.5), p10: quantile(ts, 0.1) };
};
for (const kind of KINDS) await time(kind, 10); // shaders compiled
const c = globalThis.__gpuCounters;
const result = { runs, rounds, phases: [] };
for (let r = 0; r < rounds; r++) {
  for (const kind of r % 2 ? [...KINDS].reverse() : KINDS) {
    const s0 = c?.snapshot();
    const t = await time(kind, runs);
    const d = c ? Object.fromEntries(Object.entries(c.snapshot()).filter(([k, v]) => typeof v === 'number').map(([k, v]) => [k, (v - s0[k]) / runs])) : {};
    result.phases.push({ round: r, kind, ...t, dispatches: d.dispatches });
    console.error(`round ${r} ${kind}: median ${t.median.toFixed(2)} ms, p10 ${t.p10.toFixed(2)} ms, ${d.dispatches} dispatches/run`);
  }
}
console.log(JSON.stringify(result));
process.exit(0);

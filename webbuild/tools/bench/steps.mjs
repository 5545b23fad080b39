// One decode step in isolation on onnxruntime-web's wasm EP (1 thread), past length 60: the fused
// decoder (`webbuild fuse` output) against the split export's decoder_step, same random inputs.
// Separates the graphs' kernel time from the site runtime's per-token work around session.run.
//   node webbuild/tools/bench/steps.mjs FUSED_DIR SPLIT_DIR      (FUSED_DIR from: webbuild fuse SPLIT_DIR -o FUSED_DIR)
// Prints p10 / median / p90 ms of 200 runs after 10 warm-ups. Shapes: the tiny example's.
import { readFile } from 'node:fs/promises';
import path from 'node:path';

import { importOrt } from './ort.mjs';

const [fusedDir, splitDir] = process.argv.slice(2).map((d) => path.resolve(d));
const ort = await importOrt();
const P = 60, L = 4, H = 256;
/** @param {number} n */
const f32 = (n) => Float32Array.from({ length: n }, () => Math.random());
/**
 * @param {import('onnxruntime-web').InferenceSession} s
 * @param {import('onnxruntime-web').InferenceSession.FeedsType} feeds
 * @param {number} [n] timed runs
 */
async function bench(s, feeds, n = 200) {
  for (let i = 0; i < 10; i++) await s.run(feeds);
  /** @type {number[]} */
  const ts = [];
  for (let i = 0; i < n; i++) { const t = performance.now(); await s.run(feeds); ts.push(performance.now() - t); }
  ts.sort((a, b) => a - b);
  return [0.1, 0.5, 0.9].map((q) => ts[Math.floor(q * (n - 1))].toFixed(3));
}
/** @type {import('onnxruntime-web').InferenceSession.SessionOptions} */
const opts = { executionProviders: ['wasm'], graphOptimizationLevel: 'all' };
const data = new Uint8Array(await readFile(path.join(fusedDir, 'decoder.onnx.data')));
const f = await ort.InferenceSession.create(new Uint8Array(await readFile(path.join(fusedDir, 'decoder.onnx'))), { ...opts, externalData: [{ path: 'decoder.onnx.data', data }] });
/** @type {Record<string, import('onnxruntime-web').Tensor>} */
const feeds = { inputs_embeds: new ort.Tensor('float32', f32(H), [1, 1, H]), attention_mask: new ort.Tensor('int64', new BigInt64Array(P + 1).fill(1n), [1, P + 1]) };
for (let i = 0; i < L; i++) for (const k of ['key', 'value']) feeds[`past_key_values.${i}.${k}`] = new ort.Tensor('float32', f32(2 * P * 64), [1, 2, P, 64]);
console.log('fused step wasm', await bench(f, feeds));
const sd = new Uint8Array(await readFile(path.join(splitDir, 'decoder_weights.data')));
const s = await ort.InferenceSession.create(new Uint8Array(await readFile(path.join(splitDir, 'decoder_step.onnx'))), { ...opts, externalData: [{ path: 'decoder_weights.data', data: sd }] });
console.log('split step wasm', await bench(s, { input_embeds: new ort.Tensor('float32', f32(H), [1, 1, H]), position_ids: new ort.Tensor('int64', BigInt64Array.from([BigInt(P)]), [1, 1]),
  past_keys: new ort.Tensor('float32', f32(L * 2 * P * 64), [L, 1, 2, P, 64]), past_values: new ort.Tensor('float32', f32(L * 2 * P * 64), [L, 1, 2, P, 64]) }));
process.exit(0);

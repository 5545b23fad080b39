// A built encoder (pcm in) on onnxruntime-web's WebGPU EP in Node through the site's own runtime
// (runtime/asr.js loadEncoder + encode, runtime/probe.js webgpuProvider, as the site's worker does),
// against scripts/encoder_features.py's onnxruntime CPU features: max error relative to their range.
//   node scripts/encoder_features.mjs ENCODER.onnx REFERENCE.json ORT_DIST_DIR
// Vulkan driver: VK_ICD_FILENAMES / VK_DRIVER_FILES (SwiftShader here, the NVIDIA ICD on a GPU machine).
import { readFile } from 'node:fs/promises';
import path from 'node:path';

import { installDawn } from '../webbuild/tools/bench/dawn.mjs';
import { importOrt } from '../webbuild/tools/bench/ort.mjs';
import { Recogniser } from '../webbuild/template/runtime/asr.js';
import { webgpuProvider } from '../webbuild/template/runtime/probe.js';

const [encoder, reference, ortDir] = process.argv.slice(2);
const gpu = installDawn();
const ort = await importOrt(path.resolve(ortDir));
const adapter = await gpu.requestAdapter({ powerPreference: 'high-performance' });
const provider = await webgpuProvider(adapter);
console.log(`adapter ${adapter.info.vendor} ${adapter.info.architecture} ${adapter.info.description}; subgroups ` +
  `${adapter.info.subgroupMinSize}-${adapter.info.subgroupMaxSize}; own device: ${typeof provider !== 'string'}`);
const files = new Map([['encoder.onnx', await readFile(encoder)]]);
const names = { graph: 'encoder.onnx' };
try {
  files.set('encoder.onnx.data', await readFile(encoder + '.data'));
  names.data = 'encoder.onnx.data';
} catch { /* weights inside the graph */ }
const r = new Recogniser(ort, { decoder: {} }, provider);
await r.loadEncoder(files, names);
for (const clip of JSON.parse(await readFile(reference, 'utf8'))) {
  const t = performance.now();
  const got = await r.encode(Float32Array.from(clip.pcm));
  const ms = performance.now() - t;
  const want = clip.features;
  let err = 0, lo = Infinity, hi = -Infinity;
  for (let i = 0; i < want.length; i++) {
    err = Math.max(err, Math.abs(got.data[i] - want[i]));
    lo = Math.min(lo, want[i]); hi = Math.max(hi, want[i]);
  }
  console.log(`${(clip.pcm.length / 16000).toFixed(1)} s, ${got.dims[1]} tokens: max error ${(err / (hi - lo)).toExponential(1)} of the range, ${ms.toFixed(0)} ms`);
}
process.exit(0);

// Runs scripts/encoder_ops.py's probe graphs on onnxruntime-web's WebGPU EP in Node (Dawn, see
// webbuild/tools/bench/dawn.mjs; VK_ICD_FILENAMES / VK_DRIVER_FILES pick the Vulkan driver) with the default device
// or (nosubgroups) a device without the subgroups feature, as the site's runtime makes for adapters
// with subgroups under 8 lanes. Prints each graph's max error relative to the reference's range.
//   node scripts/encoder_ops.mjs OPS_DIR ORT_DIST_DIR [default|nosubgroups]
import { readFile } from 'node:fs/promises';
import path from 'node:path';
const [dir, ortDir] = process.argv.slice(2);
const { installDawn } = await import('../webbuild/tools/bench/dawn.mjs');
const { importOrt } = await import('../webbuild/tools/bench/ort.mjs');
const gpu = installDawn();
const ort = await importOrt(path.resolve(ortDir));
const adapter = await gpu.requestAdapter({ powerPreference: 'high-performance' });
console.log('adapter', adapter.info.vendor, adapter.info.architecture, adapter.info.description, 'subgroups', adapter.features.has('subgroups'), adapter.info.subgroupMinSize, adapter.info.subgroupMaxSize, 'f16', adapter.features.has('shader-f16'));
const mode = process.argv[4] ?? 'default';
let provider = 'webgpu';
if (mode === 'nosubgroups') {
  const requiredLimits = {}; for (const k in adapter.limits) requiredLimits[k] = adapter.limits[k];
  provider = { name: 'webgpu', device: await adapter.requestDevice({ requiredFeatures: [...adapter.features].filter((f) => !f.startsWith('subgroup')), requiredLimits }) };
}
const index = JSON.parse(await readFile(dir + '/index.json', 'utf8'));
const toF16 = (a) => { const u = new Uint16Array(a.length); const f = new Float32Array(1), i = new Uint32Array(f.buffer);
  for (let j = 0; j < a.length; j++) { f[0] = a[j]; const x = i[0], s = (x >>> 16) & 0x8000; let e = ((x >>> 23) & 0xff) - 112, m = x & 0x7fffff;
    if (e <= 0) u[j] = s; else if (e >= 31) u[j] = s | 0x7bff; else { let h = s | (e << 10) | (m >> 13); if (m & 0x1000) h++; u[j] = h; } } return u; };
const fromF16 = (h) => { const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, m = h & 0x3ff; return e === 0 ? s * m * 2 ** -24 : s * (1 + m / 1024) * 2 ** (e - 15); };
for (const [name, c] of Object.entries(index)) {
  if (mode === 'f16only' && c.dtype !== 'float16') continue;
  if (c.dtype === 'float16' && !adapter.features.has('shader-f16')) continue;
  try {
    const s = await ort.InferenceSession.create(new Uint8Array(await readFile(`${dir}/${name}.onnx`)),
      { executionProviders: [provider], extra: { session: { disable_cpu_ep_fallback: '1' } } });
    const feeds = {};
    for (const [k, v] of Object.entries(c.feeds)) feeds[k] = c.dtype === 'float16' ? new ort.Tensor('float16', toF16(v.data), v.dims) : new ort.Tensor('float32', Float32Array.from(v.data), v.dims);
    const out = await s.run(feeds);
    let err = 0, lo = Infinity, hi = -Infinity;
    for (const [k, want] of Object.entries(c.expected)) {
      const d = out[k].data;
      for (let i = 0; i < want.length; i++) { const g = c.dtype === 'float16' ? fromF16(d[i]) : d[i]; err = Math.max(err, Math.abs(g - want[i])); lo = Math.min(lo, want[i]); hi = Math.max(hi, want[i]); }
    }
    console.log(mode, name, (err / (hi - lo)).toExponential(1));
    await s.release();
  } catch (e) { console.log(mode, name, 'FAIL', String(e.message || e).slice(0, 200)); }
}
process.exit(0);

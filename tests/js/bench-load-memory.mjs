// Peak renderer memory while Chromium loads a sharded model with loader.js.
//   node tests/js/bench-load-memory.mjs --site DIR        (a folder holding manifest.json)
//   node tests/js/bench-load-memory.mjs --synthetic-0.6b  (random bytes, 0.6b int4/fp16 sizes)
// Prints one JSON line: model bytes, renderer peak RSS idle / cold (network) / warm (Cache API).
// --ort DIR (onnxruntime-web's dist/): also create ORT sessions (wasm EP) from the loaded bytes,
//   with ORT's wasm taken from the shards; proves the reassembled files work in the runtime.
// --files A,B: load only these logical files (default: all). --no-cache: loader without a cache.
// --max-ratio R: exit 1 if (peak - idle) / model bytes exceeds R (a guard for CI; 1.0 = one copy).
import path from 'node:path';

import { CHROMIUM, runPage } from './chromium.mjs';
import { REPO, buildFixture, removeTempDir, tempDir } from './fixture.mjs';
import { startServer } from '../../webbuild/tools/bench/server.mjs';

const MIB = 2 ** 20;
// Estimated fp16-variant sizes of the 0.6b preset after int4 quantization (DESIGN.md shapes):
// decoder 28 x 15.7M weights + 155M tied embedding at 0.5625 B/weight, encoder 173M fp16.
const SYNTHETIC_06B = {
  'encoder.fp16.onnx.data': 330 * MIB, 'encoder.fp16.onnx': 2 * MIB,
  'decoder.int4.onnx.data': 335 * MIB, 'decoder.int4.onnx': 1 * MIB,
  'ort-wasm-simd-threaded.jsep.wasm': 25.5 * MIB, 'tokenizer.json': 7 * MIB,
};

const args = process.argv.slice(2);
const tmp = tempDir();
try {
  const site = args[0] === '--site' ? path.resolve(args[1])
    : buildFixture(tmp, Object.fromEntries(Object.entries(SYNTHETIC_06B).map(([k, v]) => [k, Math.round(v)])),
      { maxBytes: 25 * MIB, modelId: 'synthetic-0.6b' }).dir;
  const srv = await startServer(site, { mounts: {
    '/runtime/': path.join(REPO, 'webbuild/template/runtime'), '/page/': path.join(REPO, 'tests/js/browser'),
    ...(args.includes('--ort') && { '/ort/': path.resolve(args[args.indexOf('--ort') + 1]) }),
  } });
  const profile = path.join(tmp, 'profile');
  const page = (q) => runPage(srv, `${srv.url}page/page.html?${q}`, profile, { timeoutMs: 300000 });
  const idle = await page('action=idle');
  const only = (args.includes('--files') ? `&files=${encodeURIComponent(args[args.indexOf('--files') + 1])}` : '') + (args.includes('--no-cache') ? '&cache=0' : '');
  const cold = await page(`action=load&check=0${only}`);
  const warm = await page(`action=load&check=0${only}`);
  const sessions = args.includes('--ort') ? await page('action=session') : undefined;
  if (sessions) sessions.ortWasmRequests = srv.log.filter((r) => r.path.startsWith('/ort/') && r.path.endsWith('.wasm')).length;
  await srv.close();
  for (const r of [cold, warm]) if (r.error) throw new Error(r.error);
  const mib = (b) => Math.round(b / MIB);
  const ratio = (r) => +((r.rendererPeakRssBytes - idle.rendererPeakRssBytes) / r.bytes).toFixed(3);
  console.log(JSON.stringify({
    chromium: CHROMIUM, model_mib: mib(cold.bytes), idle_peak_rss_mib: mib(idle.rendererPeakRssBytes),
    cold: { peak_rss_mib: mib(cold.rendererPeakRssBytes), over_idle_per_model_byte: ratio(cold), ms: cold.ms },
    warm: { peak_rss_mib: mib(warm.rendererPeakRssBytes), over_idle_per_model_byte: ratio(warm), ms: warm.ms },
    warnings: [...cold.warnings, ...warm.warnings],
    ...(sessions && { session: { ...sessions, peak_rss_mib: mib(sessions.rendererPeakRssBytes ?? 0) } }),
  }));
  const max = args.includes('--max-ratio') ? Number(args[args.indexOf('--max-ratio') + 1]) : Infinity;
  if (Math.max(ratio(cold), ratio(warm)) > max) {
    console.error(`peak memory over idle exceeds ${max} x model size`);
    process.exitCode = 1;
  }
} finally {
  removeTempDir(tmp);
}

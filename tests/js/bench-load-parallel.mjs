// The load beside a busy thread: headless Chromium loads a synthetic sharded model (random bytes) in a module
// worker that spends `busy` ms of synchronous work per file as each file is ready (as making its session does),
// with the loader in that thread (startLoad) or in its own worker (startLoadInWorker); a fresh profile per load
// (the first visit: download, sha256, Cache API writes). Rounds alternate the modes.
//   node tests/js/bench-load-parallel.mjs [--files 4] [--file-mib 128] [--shard-mib 64] [--busy 500] [--rounds 3]
//     [--modes thread,worker,base] [--base DIR (another checkout's webbuild/template/runtime, for mode base)]
//     [--no-cache] [--check]
// Prints one JSON line per load: ready_ms (every file verified and its busy work done), done_ms (the cache
// writes made too), the loader's stats.
import path from 'node:path';

import { runPage } from './chromium.mjs';
import { REPO, buildFixture, removeTempDir, tempDir } from './fixture.mjs';
import { startServer } from '../../webbuild/tools/bench/server.mjs';

const MIB = 2 ** 20;
const args = process.argv.slice(2);
const arg = (name, dflt) => (args.includes(name) ? args[args.indexOf(name) + 1] : dflt);
const files = Number(arg('--files', 4));
const tmp = tempDir();
try {
  const sizes = Object.fromEntries(Array.from({ length: files }, (_, i) => [`graph${i}.onnx.data`, Number(arg('--file-mib', 128)) * MIB]));
  const site = buildFixture(tmp, sizes, { maxBytes: Number(arg('--shard-mib', 64)) * MIB, modelId: 'synthetic-parallel' }).dir;
  const base = args.includes('--base') ? { '/base-runtime/': path.resolve(arg('--base')) } : {};
  const srv = await startServer(site, { mounts: { '/runtime/': path.join(REPO, 'webbuild/template/runtime'),
    '/page/': path.join(REPO, 'tests/js/browser'), ...base } });
  const q = `busy=${arg('--busy', 500)}&cache=${args.includes('--no-cache') ? 0 : 1}&check=${args.includes('--check') ? 1 : 0}`;
  for (let round = 0; round < Number(arg('--rounds', 3)); round++) {
    for (const mode of arg('--modes', 'thread,worker').split(',')) {
      const profile = path.join(tmp, `profile-${round}-${mode}`);
      const r = await runPage(srv, `${srv.url}page/page.html?action=parallel&mode=${mode}&${q}`, profile, { timeoutMs: 300000 });
      if (r.error) throw new Error(r.error);
      const { stats, ...rest } = r;
      console.log(JSON.stringify({ round, ...rest, ...Object.fromEntries(Object.entries(stats).map(([k, v]) => [k, Math.round(v)])) }));
    }
  }
  await srv.close();
} finally {
  await new Promise((r) => setTimeout(r, 1000)); // the browser's last processes leave its profiles
  try { removeTempDir(tmp); } catch (e) { console.error(`left ${tmp}: ${e.message}`); }
}

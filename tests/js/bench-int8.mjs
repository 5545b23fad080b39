// The int8 twin's load-time derivation (runtime/int8.js int8Weights) alone, on the 0.6b's sizes: int4
// weights with random codes and scales, K x N per shape (default: one 1024 x 3072 projection and the 151936 x
// 1024 output head, K = 1024, N = 151936), rounds alternating this checkout's int8.js with another's.
//   node tests/js/bench-int8.mjs [--shapes 1024x3072,1024x151936] [--rounds 3] [--base DIR (a runtime/ with int8.js)]
// Prints one JSON line per run (ms; cpu_ms, this process's CPU time, steadier on a busy box; MB/s of uint8 out) and whether the two made the same bytes.
import { createHash } from 'node:crypto';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

import { synthetic } from './browser/int8-synthetic.js';

const args = process.argv.slice(2);
const arg = (name, dflt) => (args.includes(name) ? args[args.indexOf(name) + 1] : dflt);
const here = path.resolve(import.meta.dirname, '../../webbuild/template/runtime/int8.js');
const forms = { new: await import(pathToFileURL(here).href) };
if (args.includes('--base')) forms.base = await import(pathToFileURL(path.resolve(arg('--base'), 'int8.js')).href);

const shapes = arg('--shapes', '1024x3072,1024x151936').split(',').map((s) => s.split('x').map(Number));
const { plan, source } = synthetic(shapes);
const digests = {};
for (let round = 0; round < Number(arg('--rounds', 3)); round++) {
  for (const [name, form] of Object.entries(forms)) {
    const t0 = performance.now(), cpu0 = process.cpuUsage();
    const out = form.int8Weights(plan, source);
    const ms = performance.now() - t0, cpu = process.cpuUsage(cpu0);
    digests[name] = createHash('sha256').update(out).digest('hex');
    console.log(JSON.stringify({ form: name, round, shapes: shapes.map((s) => s.join('x')).join(','), ms: Math.round(ms),
      cpu_ms: Math.round((cpu.user + cpu.system) / 1e3),      mb_per_s: Math.round(plan.bytes / 1e3 / ms) }));
  }
}
console.log(JSON.stringify({ same_bytes: new Set(Object.values(digests)).size === 1, sha256: digests.new }));

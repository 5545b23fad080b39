// Does keeping a build's adapted decoder loaded slow the base decode? (docs/adapters.md, BENCHMARKS.md
// "LoRA adapters".) Separate processes of two builds differ by more than the question (the same build
// moves 50% between runs on the H200), so this asks it inside one process, on one device: the site of a
// build with adapters loaded as the page loads it, then its synthetic decode (adapter off: the base
// sessions) timed in rounds ordered ABBA, where A has the adapted sessions released and B has them
// created again and warmed up, as at load.
//
//   node webbuild/tools/bench/adapted_ab.mjs DIST [--rounds 4] [--decode-tokens 128] [--warm-tokens 8]
//
// Prints one JSON report on stdout: per phase, the median and mean ms per token, and the time inside
// WebGPU calls per token (timing.mjs's call clock), with the means of each arm and their ratio.
import path from 'node:path';
import { pathToFileURL } from 'node:url';

import { installDawn } from './dawn.mjs';
import { parseArgs } from './ort.mjs';
import { startServer } from './server.mjs';
import { mean, quantile } from './stats.mjs';

const USAGE = 'adapted_ab.mjs DIST [--rounds R] [--decode-tokens N] [--warm-tokens W]';
/** @typedef {import('../../template/runtime/site.js').Site} Site */
/** @typedef {import('../../template/runtime/asr.js').Recogniser} Recogniser */
/** @typedef {import('webbuild-types').Runtime} Runtime */

/** @param {string} line */
const log = (line) => console.error(`[adapted-ab] ${line}`);

// The adapted sessions released (GPU memory and their captured step with them); the base ones stay.
/** @param {Recogniser} rec */
async function dropAdapted(rec) {
  const set = /** @type {import('../../template/runtime/asr.js').DecoderSet} */ (rec.adapted); // called with one
  rec.adapted = null;
  rec.active = rec.base;
  await set.steps?.session.release();
  await set.decoder.release();
  for (const t of Object.values(/** @type {import('../../template/runtime/lora.js').LoraInputs} */ (set.lora).feeds)) t.gpuBuffer?.destroy();
}

// The adapted sessions created again from the variant's files and warmed up, as loadSite does.
/**
 * @param {{site: typeof import('../../template/runtime/site.js'), loader: typeof import('../../template/runtime/loader.js')}} m
 * @param {Site} site
 */
async function restoreAdapted(m, site) {
  const { manifest, runtime, variant, recogniser: rec } = site;
  const graphs = m.site.variantGraphs(manifest.variants[variant], runtime.roles, manifest);
  const files = await m.loader.loadFiles(manifest, manifest.variants[variant].files, site.loading);
  // a build with adapters: both are there
  await rec.loadAdapted(files, /** @type {import('../../template/runtime/asr.js').GraphFiles} */ (graphs.decoder_lora),
    /** @type {Record<string, number[]>} */ (graphs.lora));
  await rec.warmUp({ shapes: site.warmShapes }); // as at load
}

// One timed synthetic decode of the base (n steps after two seconds of silence, as bench.mjs's).
/**
 * @param {Recogniser} rec
 * @param {Runtime} runtime
 * @param {number} n
 */
async function timedDecode(rec, runtime, n) {
  const silence = new Float32Array(2 * runtime.sample_rate);
  /** @type {number[]} */
  const stamps = [];
  // installDawn installed it
  const clock = /** @type {import('./timing.mjs').GpuTiming} */ (/** @type {import('./timing.mjs').GpuScope} */ (globalThis).__gpuTiming);
  const c0 = { ms: clock.callMs, calls: clock.calls };
  await rec.transcribe(silence, { maxNewTokens: n + 1, forceSteps: true, onToken: () => stamps.push(performance.now()) });
  const steps = stamps.slice(1).map((t, i) => t - stamps[i]);
  return {
    median_ms: /** @type {number} */ (quantile(steps, 0.5)), mean_ms: mean(steps), // median: of n >= 1 steps
    call_ms_per_token: (clock.callMs - c0.ms) / steps.length, calls_per_token: (clock.calls - c0.calls) / steps.length,
  };
}

async function main() {
  const o = parseArgs(process.argv.slice(2), { rounds: 4, warmTokens: 8, ep: 'webgpu' }, USAGE);
  installDawn();
  const srv = await startServer(o.dir);
  try {
    /** @param {string} rel */
    const load = (rel) => import(pathToFileURL(path.join(o.dir, rel)).href);
    /** @type {{site: typeof import('../../template/runtime/site.js'), loader: typeof import('../../template/runtime/loader.js')}} */
    const m = { site: await load('runtime/site.js'), loader: await load('runtime/loader.js') };
    const site = await m.site.loadSite(`${srv.url}model/`, { forceEp: 'webgpu', fallback: false, onWarning: () => {} });
    const rec = site.recogniser;
    if (!rec.adapted) throw new Error(`${o.dir}: no adapted decoder (a build with adapters, on WebGPU, has one)`);
    /** @type {({round: number, arm: string, decode: string} & Awaited<ReturnType<typeof timedDecode>>)[]} */
    const phases = [];
    for (let r = 0; r < o.rounds; r++) {
      for (const arm of r % 2 ? ['without', 'with'] : ['with', 'without']) { // ABBA: drift cancels
        if (arm === 'without' && rec.adapted) await dropAdapted(rec);
        if (arm === 'with' && !rec.adapted) await restoreAdapted(m, site);
        await timedDecode(rec, site.runtime, o.warmTokens); // the first steps after a switch of arm are not the question
        const t = await timedDecode(rec, site.runtime, o.decodeTokens);
        phases.push({ round: r, arm, decode: rec.decodeMode, ...t });
        log(`round ${r} ${arm} adapted sessions: ${t.median_ms.toFixed(2)} ms/token median, ${t.call_ms_per_token.toFixed(2)} ms in WebGPU calls`);
      }
    }
    /** @param {string} name */
    const arm = (name) => {
      const ps = phases.filter((p) => p.arm === name);
      return { median_ms: mean(ps.map((p) => p.median_ms)), mean_ms: mean(ps.map((p) => p.mean_ms)),
        call_ms_per_token: mean(ps.map((p) => p.call_ms_per_token)), calls_per_token: mean(ps.map((p) => p.calls_per_token)) };
    };
    const [without, withAdapted] = [arm('without'), arm('with')];
    console.log(JSON.stringify({
      bench: 'adapted-ab', dir: o.dir, adapter: site.gpu.description, tokens: o.decodeTokens, rounds: o.rounds, phases,
      without, with: withAdapted,
      ratio: { median_ms: withAdapted.median_ms / without.median_ms, call_ms_per_token: withAdapted.call_ms_per_token / without.call_ms_per_token },
    }));
  } finally {
    await srv.close();
  }
}

main().then(() => process.exit(0), (e) => { console.error(e?.stack ?? String(e)); process.exit(1); });

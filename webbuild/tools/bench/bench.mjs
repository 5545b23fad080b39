// Benchmarks a built site (dist/) in Node with the site's own runtime modules and its own
// onnxruntime-web copy, imported from the built folder (not from webbuild/template/): site.js loads
// the model as the page's worker does (loader.js fetches the shards over loopback HTTP, probe.js picks
// the EP and variant, asr.js runs the encoder, prefill and greedy decode); the clips are the site's
// samples.json. Prints one JSON report on stdout.
//
//   node webbuild/tools/bench/bench.mjs DIST [--ep auto|webgpu|wasm] [--decode-tokens 128] [--repeat 1]
//        [--threads N] [--variant NAME] [--max-clips N] [--max-new-tokens N] [--session-config K=V]...
//        [--adapter NAME]
//
// --adapter: the site's LoRA adapter NAME (docs/adapters.md) switched on after loading, off, and on again,
// the WebGPU calls of each switch counted (`lora_switches`); the clips and the synthetic decode then run
// with it on. Without it they run on the base model, as the page does until a visitor picks an adapter.
//
// --max-new-tokens: caps each clip's greedy decode (default: runtime.json's max_new_tokens), for models
// slow enough on an EP that a full transcript would take minutes (the 0.6b on wasm).
//
// --threads: ORT's wasm threads; 1 by default because onnxruntime-web's threaded glue loads its
// worker through fetch() + a blob: URL import, which Node's file: URLs do not allow.
//
// --ep webgpu runs Dawn (the `webgpu` package); pick the Vulkan driver with the environment:
//   SwiftShader: LD_LIBRARY_PATH=/usr/lib/chromium VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json
//   NVIDIA:      VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json (or the driver's ICD file)
import { readFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

import { gpuCountedDecodes, gpuCountsDelta } from './counters.mjs';
import { wasmHeapBytes } from '../../template/runtime/heap.js';
import { startServer } from './server.mjs';
import { parseArgs, tryDawn } from './ort.mjs';
import { quantile, spread } from './stats.mjs';
import { gpuTimingPerToken } from './timing.mjs';

const USAGE = 'bench.mjs DIST [--ep auto|webgpu|wasm] [--decode-tokens N] [--repeat R] [--threads N] [--variant NAME] [--max-clips N] [--max-new-tokens N] [--session-config K=V]... [--adapter NAME] [--warm-up shapes|decode|second]';
/** @typedef {import('../../template/runtime/site.js').Site} Site */
/** @typedef {import('../../template/runtime/asr.js').Recogniser} Recogniser */
/** @typedef {import('./timing.mjs').GpuScope} GpuScope */
/**
 * The site's modules (siteModules).
 * @typedef {{contract: typeof import('../../template/runtime/contract.js'), site: typeof import('../../template/runtime/site.js'),
 *   asr: typeof import('../../template/runtime/asr.js'), lora: typeof import('../../template/runtime/lora.js'),
 *   audio: typeof import('../../template/app/audio.js')}} SiteModules
 */
/** @type {{repeat: number, threads: number, variant: string | null, maxClips: number, maxNewTokens: number, graphCapture: number, adapter: string,
 *   warmUp: string}} */
const OPTIONS = { repeat: 1, threads: 1, variant: null, maxClips: Infinity, maxNewTokens: 0, graphCapture: 1, adapter: '',
  warmUp: 'shapes' };

// The site's modules, from the built folder (asr.js: the same module instance site.js runs).
/**
 * @param {string} dir
 * @returns {Promise<SiteModules>}
 */
async function siteModules(dir) {
  /** @param {string} rel */
  const load = (rel) => import(pathToFileURL(path.join(dir, rel)).href);
  const [contract, site, asr, lora, audio] = await Promise.all([load('runtime/contract.js'), load('runtime/site.js'),
    load('runtime/asr.js'), load('runtime/lora.js'), load('app/audio.js')]);
  return { contract, site, asr, lora, audio };
}

// The site's sample clips and their expected texts, as the page lists them.
/**
 * @param {SiteModules} m
 * @param {string} dir
 * @returns {Promise<{src: string, text: string}[]>}
 */
async function sampleClips(m, dir) {
  return JSON.parse(await readFile(path.join(dir, m.contract.SAMPLES_FILE), 'utf8')).samples;
}

/**
 * @param {SiteModules} m
 * @param {import('./server.mjs').Srv} srv
 * @param {ReturnType<typeof parseArgs<typeof OPTIONS>>} o
 */
async function loadModel(m, srv, o) {
  if (Object.keys(o.sessionConfig).length) { // config entries to try on top of the site's own session options
    const own = m.asr.Recogniser.prototype.sessionOptions;
    m.asr.Recogniser.prototype.sessionOptions = function () { const opts = own.call(this); return { ...opts, extra: { ...opts.extra, ...o.sessionConfig } }; };
  }
  // no fallback to wasm: a WebGPU session that fails is the bench's answer
  const site = await m.site.loadSite(`${srv.url}model/`, {
    // 'webgpu' keeps WebGPU on a software adapter (--swiftshader), where the site's own choice is wasm
    forceEp: o.ep === 'auto' ? undefined : o.ep, variant: o.variant, threads: o.threads,
    graphCapture: Boolean(o.graphCapture),
    // every shape class warmed as on a hardware GPU, also on a software one (--warm-up shapes), or all but the
    // longest chunk's (decode), or a second of silence (second: no shape class, as a page on a software GPU)
    warmShapes: o.warmUp !== 'second',
    warmLong: o.warmUp === 'shapes',
    fallback: false, onWarning: () => {},
  });
  const { gpu } = site;
  if (o.ep === 'webgpu' && !gpu.gpuAdapter) throw new Error(`no WebGPU GPU: ${gpu.reason}`);
  return {
    rec: site.recogniser, runtime: site.runtime, site,
    info: {
      ep: site.ep, variant: site.variant, threads: o.threads, kv_cache: site.recogniser.kvLocation ?? null, decode: site.recogniser.decodeMode,
      gpu: site.ep === 'webgpu' ? gpu.description
        : `none (WebAssembly on the CPU, ${os.cpus()[0]?.model ?? 'cpu'})`,
      shader_f16: Boolean(gpu.shaderF16), fallback_gpu: Boolean(gpu.fallback), model_bytes: site.modelBytes,
      prefill_runs: { limit: site.recogniser.prefillRunLimit, check: site.recogniser.longRunsCheck },
    },
    load: site.load,
  };
}

// One transcription with per-token timestamps (onToken fires once per generated token, right
// after the decoder run that produced it): the gaps between them are the decode step times. stamps and
// ids (the token ids) are for timing.mjs, not the report.
/**
 * @param {Recogniser} rec
 * @param {Float32Array} pcm
 * @param {Parameters<Recogniser['transcribe']>[1]} [opts]
 */
async function timedTranscribe(rec, pcm, opts = {}) {
  /** @type {number[]} */
  const stamps = [];
  const r = await rec.transcribe(pcm, { ...opts, onToken: () => stamps.push(performance.now()) });
  const steps = stamps.slice(1).map((t, i) => t - stamps[i]);
  const t = r.timings;
  return {
    text: r.text, tokens: r.tokens.length, steps, stamps, ids: r.tokens, margins: r.margins,
    encoder_ms: t.encoder_ms, prefill_ms: t.prefill_ms, prompt_tokens: t.prompt_tokens, ttft_ms: t.ttft_ms,
    prefill_tokens_per_s: (t.prompt_tokens / t.prefill_ms) * 1000, audio_ms: t.audio_ms, total_ms: t.total_ms,
  };
}

// The adapter switched on, off and on again (lora.js switchLora), each switch timed and its WebGPU calls
// counted (counters.mjs totals, kernels left out; null on the wasm EP, which makes none).
/**
 * @param {SiteModules} m
 * @param {Site} site
 * @param {string} name the adapter
 */
async function countedSwitches(m, site, name) {
  const c = site.ep === 'webgpu' ? /** @type {GpuScope} */ (globalThis).__gpuCounters : null;
  /** @type {{to: string | null, ms: number, counts: object | null}[]} */
  const switches = [];
  for (const to of [name, null, name]) {
    const s0 = c?.snapshot();
    const t0 = performance.now();
    await m.lora.switchLora(site, to);
    // s0 is there with c
    const { kernels, ...counts } = c ? gpuCountsDelta(/** @type {import('./counters.mjs').GpuCounts} */ (s0), c.snapshot()) : {};
    switches.push({ to, ms: performance.now() - t0, counts: c ? counts : null });
  }
  log(`adapter ${name}: on, off and on again in ${switches.map((s) => s.ms.toFixed(0)).join(', ')} ms`);
  return switches;
}

/** @param {string} line */
const log = (line) => console.error(`[bench] ${line}`); // progress on stderr; the report alone on stdout

async function main() {
  const o = parseArgs(process.argv.slice(2), OPTIONS, USAGE);
  if (o.ep !== 'wasm') await tryDawn(o.ep);
  const srv = await startServer(o.dir);
  try {
    const m = await siteModules(o.dir);
    log('loading the model (shards over loopback HTTP, sessions created)');
    const model = await loadModel(m, srv, o);
    const loraSwitches = o.adapter ? await countedSwitches(m, model.site, o.adapter) : null;
    // how the measured decode runs: with an adapter on, the adapted set's (its step form may have fallen back)
    model.info.decode = model.rec.decodeMode;
    if (model.info.ep === 'webgpu') { // timing.mjs: the decoder's runs, or the captured decode's steps
      /** @type {GpuScope} */ (globalThis).__gpuTiming?.watchRun(model.rec.decoder);
      if (model.rec.steps) /** @type {GpuScope} */ (globalThis).__gpuTiming?.watchRun(model.rec.steps, 'issue');
    }
    const heapLoaded = wasmHeapBytes();
    log(`loaded: ${model.info.ep} ${model.info.variant} on ${model.info.gpu} in ${model.load.total_ms.toFixed(0)} ms`);
    const clipOpts = o.maxNewTokens ? { maxNewTokens: o.maxNewTokens } : {};
    /** @type {({src: string, expected: string, match: boolean, token_ids: number[]} & Omit<Awaited<ReturnType<typeof timedTranscribe>>, 'stamps' | 'ids'>)[]} */
    const clips = [];
    const samples = (await sampleClips(m, o.dir)).slice(0, o.maxClips);
    const runs = samples.length * o.repeat;
    for (const c of samples) {
      // the page's own decoding: its WAV reader and the project's resampler (app/audio.js)
      const bytes = await readFile(path.join(o.dir, c.src));
      const pcm = await m.audio.decodeToMono16k(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength), c.src);
      for (let i = 0; i < o.repeat; i++) {
        const { stamps, ids, ...r } = await timedTranscribe(model.rec, pcm, clipOpts);
        clips.push({ src: c.src, expected: c.text, match: r.text === c.text, ...r, token_ids: ids });
        log(`clip ${clips.length} of ${runs}: ${c.src}: ${JSON.stringify(r.text)} ${r.total_ms.toFixed(0)} ms`);
      }
    }
    // Synthetic decode: N greedy steps past any end token, after a prompt of two seconds of silence
    // (41 tokens for Qwen3-ASR: the prompt length merged.mjs and split.mjs give the peers).
    // A shorter one first: WebGPU calls per token are the difference (counters.mjs).
    // Then the long one's time per token cut into phases, and a separate GPU-timed decode (timing.mjs).
    const silence = new Float32Array(2 * model.runtime.sample_rate);
    /** @param {number} n */
    const synthDecode = (n) => timedTranscribe(model.rec, silence, { maxNewTokens: n + 1, forceSteps: true });
    log(`synthetic decode: ${o.decodeTokens} tokens after 2 s of silence${model.info.ep === 'webgpu' ? ' (and a short one: WebGPU calls per token)' : ''}`);
    const { result: synth, counters_per_token } = await gpuCountedDecodes(synthDecode, o.decodeTokens, model.info.ep === 'webgpu');
    log(`synthetic decode: ${spread(synth.steps).median?.toFixed(1)} ms per token${model.info.ep === 'webgpu' ? '; then timed on the GPU' : ''}`);
    const timing_per_token = await gpuTimingPerToken(synthDecode, synth);
    const clipSteps = clips.flatMap((c) => c.steps);
    /** @param {'encoder_ms' | 'ttft_ms' | 'prefill_ms' | 'prompt_tokens' | 'prefill_tokens_per_s'} k */
    const median = (k) => quantile(clips.map((c) => c[k]), 0.5);
    console.log(JSON.stringify({
      bench: 'webbuild-node', node: process.version, dir: o.dir, session_config: o.sessionConfig, ...model.info, load: model.load,
      lora: o.adapter || null, lora_switches: loraSwitches,
      clips: clips.map(({ steps, ...c }) => ({ ...c, decode_ms_per_token: quantile(steps, 0.5) })),
      summary: {
        clips: clips.length, clips_matching: clips.filter((c) => c.match).length,
        encoder_ms: median('encoder_ms'), ttft_ms: median('ttft_ms'), prefill_ms: median('prefill_ms'),
        prompt_tokens: median('prompt_tokens'), prefill_tokens_per_s: median('prefill_tokens_per_s'),
        decode_ms_per_token_clips: spread(clipSteps),
      },
      synthetic_decode: { prompt_tokens: synth.prompt_tokens, prefill_ms: synth.prefill_ms, tokens: synth.steps.length,
        ms_per_token: spread(synth.steps), token_ids: synth.ids, margins: synth.margins },
      counters_per_token, timing_per_token,
      // onnxruntime-web's wasm memory (runtime/heap.js): after the sessions and warm-up, and at the end (the peak)
      wasm_heap_bytes: { loaded: heapLoaded, peak: wasmHeapBytes() },
    }));
  } finally {
    await srv.close();
  }
}

main().then(() => process.exit(0), (e) => { console.error(e?.stack ?? String(e)); process.exit(1); });

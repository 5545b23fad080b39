// Benchmarks a built site (dist/) in Node with the site's own runtime modules and its own
// onnxruntime-web copy, imported from the built folder (not from webbuild/template/): site.js loads
// the model as the page's worker does (loader.js fetches the shards over loopback HTTP, probe.js picks
// the EP and variant, asr.js runs the encoder, prefill and greedy decode); the clips are the site's
// samples.json. Prints one JSON report on stdout.
//
//   node webbuild/tools/bench/bench.mjs DIST [--ep auto|webgpu|wasm] [--decode-tokens 128] [--repeat 1]
//        [--threads N] [--variant NAME] [--max-clips N] [--max-new-tokens N] [--session-config K=V]...
//        [--adapter NAME] [--decode-forms auto|both]
//
// --decode-forms both: the clips and the synthetic decode run twice on the one load, in the captured form (forced
// at load, not measured: the bench measures both forms itself) and then in plain steps (transcribe's `captured:
// false`, every step a run of the decoder session, as --graph-capture 0 decodes); the report's keys are the captured
// form's, its `plain` object the plain steps' same keys. One Node load instead of two: on a software GPU the load
// is most of a run. auto (the default): the form the load chooses, once.
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

const USAGE = 'bench.mjs DIST [--ep auto|webgpu|wasm] [--decode-tokens N] [--repeat R] [--threads N] [--variant NAME] [--max-clips N] [--max-new-tokens N] [--session-config K=V]... [--adapter NAME] [--warm-up shapes|decode|second] [--decode-forms auto|both]';
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
 *   warmUp: string, decodeForms: string}} */
const OPTIONS = { repeat: 1, threads: 1, variant: null, maxClips: Infinity, maxNewTokens: 0, graphCapture: 1, adapter: '',
  warmUp: 'shapes', decodeForms: 'auto' };
const DECODE_FORMS = ['auto', 'both'];
// the plain form's `decode` in a --decode-forms both report (the captured form's is the recogniser's decodeMode)
const PLAIN_ASKED = 'plain (--decode-forms both)';

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
    // both forms: the captured one decodes first whatever a measurement at load would choose (on a hardware GPU)
    decodeForm: o.decodeForms === 'both' ? 'captured' : null,
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

// The sample clips as the page reads them: its WAV reader and the project's resampler (app/audio.js); decoded once,
// for every decode form.
/**
 * @param {SiteModules} m
 * @param {string} dir
 * @param {number} maxClips
 */
async function clipAudio(m, dir, maxClips) {
  return Promise.all((await sampleClips(m, dir)).slice(0, maxClips).map(async (c) => {
    const bytes = await readFile(path.join(dir, c.src));
    const pcm = await m.audio.decodeToMono16k(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength), c.src);
    return { ...c, pcm };
  }));
}

/** @typedef {Awaited<ReturnType<typeof loadModel>>} Model */
/** @typedef {Awaited<ReturnType<typeof clipAudio>>} Clips */
/**
 * How one pass of the bench decodes: `captured` (transcribe's option: false runs every step plainly) and what its
 * progress lines start with.
 * @typedef {{captured: boolean, say: string}} Form
 */

// Each clip transcribed `repeat` times, with its decode step times.
/**
 * @param {Model} model
 * @param {Clips} samples
 * @param {ReturnType<typeof parseArgs<typeof OPTIONS>>} o
 * @param {Form} form
 */
async function transcribedClips(model, samples, o, form) {
  const opts = { captured: form.captured, ...(o.maxNewTokens && { maxNewTokens: o.maxNewTokens }) };
  /** @type {({src: string, expected: string, match: boolean, token_ids: number[]} & Omit<Awaited<ReturnType<typeof timedTranscribe>>, 'stamps' | 'ids'>)[]} */
  const clips = [];
  const runs = samples.length * o.repeat;
  for (const c of samples) {
    for (let i = 0; i < o.repeat; i++) {
      const { stamps, ids, ...r } = await timedTranscribe(model.rec, c.pcm, opts);
      clips.push({ src: c.src, expected: c.text, match: r.text === c.text, ...r, token_ids: ids });
      log(`${form.say}clip ${clips.length} of ${runs}: ${c.src}: ${JSON.stringify(r.text)} ${r.total_ms.toFixed(0)} ms`);
    }
  }
  return clips;
}

// Synthetic decode: N greedy steps past any end token, after a prompt of two seconds of silence
// (41 tokens for Qwen3-ASR: the prompt length merged.mjs and split.mjs give the peers).
// A shorter one first: WebGPU calls per token are the difference (counters.mjs).
// Then the long one's time per token cut into phases, and a separate GPU-timed decode (timing.mjs).
/**
 * @param {Model} model
 * @param {number} tokens
 * @param {Form} form
 */
async function syntheticDecode(model, tokens, form) {
  const gpu = model.info.ep === 'webgpu';
  const silence = new Float32Array(2 * model.runtime.sample_rate);
  /** @param {number} n */
  const synthDecode = (n) => timedTranscribe(model.rec, silence, { maxNewTokens: n + 1, forceSteps: true, captured: form.captured });
  log(`${form.say}synthetic decode: ${tokens} tokens after 2 s of silence${gpu ? ' (and a short one: WebGPU calls per token)' : ''}`);
  const { result: synth, counters_per_token } = await gpuCountedDecodes(synthDecode, tokens, gpu);
  log(`${form.say}synthetic decode: ${spread(synth.steps).median?.toFixed(1)} ms per token${gpu ? '; then timed on the GPU' : ''}`);
  const timing_per_token = await gpuTimingPerToken(synthDecode, synth);
  return {
    synthetic_decode: { prompt_tokens: synth.prompt_tokens, prefill_ms: synth.prefill_ms, tokens: synth.steps.length,
      ms_per_token: spread(synth.steps), token_ids: synth.ids, margins: synth.margins },
    counters_per_token, timing_per_token,
  };
}

// The report's figures of one decode form: the clips, their summary, the synthetic decode.
/**
 * @param {Model} model
 * @param {Clips} samples
 * @param {ReturnType<typeof parseArgs<typeof OPTIONS>>} o
 * @param {Form} form
 */
async function formFigures(model, samples, o, form) {
  const clips = await transcribedClips(model, samples, o, form);
  const synth = await syntheticDecode(model, o.decodeTokens, form);
  /** @param {'encoder_ms' | 'ttft_ms' | 'prefill_ms' | 'prompt_tokens' | 'prefill_tokens_per_s'} k */
  const median = (k) => quantile(clips.map((c) => c[k]), 0.5);
  return {
    clips: clips.map(({ steps, ...c }) => ({ ...c, decode_ms_per_token: quantile(steps, 0.5) })),
    summary: {
      clips: clips.length, clips_matching: clips.filter((c) => c.match).length,
      encoder_ms: median('encoder_ms'), ttft_ms: median('ttft_ms'), prefill_ms: median('prefill_ms'),
      prompt_tokens: median('prompt_tokens'), prefill_tokens_per_s: median('prefill_tokens_per_s'),
      decode_ms_per_token_clips: spread(clips.flatMap((c) => c.steps)),
    },
    ...synth,
  };
}

// --decode-forms both wants a captured form to set plain steps beside: refused, before anything is measured, on a
// load without one (the wasm EP, a step graph that could not be captured).
/** @param {Model} model */
function checkBothForms(model) {
  if (model.info.decode !== 'captured') {
    throw new Error(`--decode-forms both: this load decodes no captured form to compare plain steps with (decode: ${model.info.decode})`);
  }
}

async function main() {
  const o = parseArgs(process.argv.slice(2), OPTIONS, USAGE);
  if (!DECODE_FORMS.includes(o.decodeForms)) throw new Error(`--decode-forms ${o.decodeForms}: one of ${DECODE_FORMS.join(', ')}`);
  if (o.ep !== 'wasm') await tryDawn(o.ep);
  const srv = await startServer(o.dir);
  try {
    const m = await siteModules(o.dir);
    log('loading the model (shards over loopback HTTP, sessions created)');
    const model = await loadModel(m, srv, o);
    const loraSwitches = o.adapter ? await countedSwitches(m, model.site, o.adapter) : null;
    // how the measured decode runs: with an adapter on, the adapted set's (its step form may have fallen back)
    model.info.decode = model.rec.decodeMode;
    if (o.decodeForms === 'both') checkBothForms(model);
    if (model.info.ep === 'webgpu') { // timing.mjs: the decoder's runs, or the captured decode's steps
      /** @type {GpuScope} */ (globalThis).__gpuTiming?.watchRun(model.rec.decoder);
      if (model.rec.steps) /** @type {GpuScope} */ (globalThis).__gpuTiming?.watchRun(model.rec.steps, 'issue');
    }
    const heapLoaded = wasmHeapBytes();
    log(`loaded: ${model.info.ep} ${model.info.variant} on ${model.info.gpu} in ${model.load.total_ms.toFixed(0)} ms`);
    const samples = await clipAudio(m, o.dir, o.maxClips);
    // the load's own form first, so that its figures are those of a run without --decode-forms both
    const figures = await formFigures(model, samples, o, { captured: true, say: '' });
    const plain = o.decodeForms === 'both'
      ? { decode: PLAIN_ASKED, ...await formFigures(model, samples, o, { captured: false, say: 'plain steps: ' }) } : null;
    console.log(JSON.stringify({
      bench: 'webbuild-node', node: process.version, dir: o.dir, session_config: o.sessionConfig, ...model.info, load: model.load,
      lora: o.adapter || null, lora_switches: loraSwitches, ...figures, ...(plain && { plain }),
      // onnxruntime-web's wasm memory (runtime/heap.js): after the sessions and warm-up, and at the end (the peak)
      wasm_heap_bytes: { loaded: heapLoaded, peak: wasmHeapBytes() },
    }));
  } finally {
    await srv.close();
  }
}

main().then(() => process.exit(0), (e) => { console.error(e?.stack ?? String(e)); process.exit(1); });

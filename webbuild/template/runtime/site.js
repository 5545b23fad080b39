// The site's model, loaded as the page's worker (worker.js) and the Node bench (bench.mjs) both run
// it: the manifest; runtime.json, the build's constants (webbuild/site/contract.py); the execution
// provider and variant for this device; the variant's files and onnxruntime-web's wasm from the
// verified shards; the sessions, falling back to wasm when a WebGPU session fails; a warm-up.

import { RUNTIME_FILE } from './contract.js';
import { loadFiles, loadManifest, openModelCache, startLoadInWorker } from './loader.js';
import { chooseVariant, probeWebGPU, webgpuProvider } from './probe.js';
import { Recogniser } from './asr.js';
import { decodeRequest } from './decode-form.js';
import { startOrt } from './ort-start.js';
import { loraShapes } from './lora.js';
import { createVad } from './vad.js';

/** @typedef {import('webbuild-types').Ort} Ort */
/** @typedef {import('webbuild-types').Runtime} Runtime */
/** @typedef {import('./loader.js').LoadedManifest} LoadedManifest */
/** @typedef {import('./loader.js').LoadOptions} LoadOptions */
/** @typedef {import('./probe.js').GpuProbe} GpuProbe */
/** @typedef {import('./asr.js').Graphs} Graphs */
/** @typedef {import('./asr.js').GraphFiles} GraphFiles */
/**
 * loader.js's progress, or a step after the download (ep: the processor it prepares the model for).
 * @typedef {import('./loader.js').Progress | {phase: 'session' | 'warmup', loaded: number, total: number, ep: 'webgpu' | 'wasm'}
 *   | {phase: 'manifest' | 'gpu', loaded: number, total: number}} SiteProgress
 */
/**
 * loadSite's options (see there).
 * @typedef {object} SiteOptions
 * @property {string | null} [forceEp]
 * @property {string | null} [variant] unset or null: this device's choice
 * @property {number} [threads]
 * @property {boolean} [fallback]
 * @property {boolean} [graphCapture] false: every decode step plain
 * @property {string | null} [decodeForm] 'captured' or 'plain': that decode form; else knownDecode's, where it was
 *   measured on this GPU for this model; else (auto) the warm-up measures both on a hardware GPU and the faster
 *   decodes (runtime/decode-form.js); 'measure': measured even on a software GPU
 * @property {import('./decode-form.js').DecodeChoice | null} [knownDecode] a choice measured before (app/decode-choice.js)
 * @property {string | null} [prefillRuns] 'whole': a WebGPU prompt in one prefill run, 'chunked': in runs of the build's
 *   webgpu_prefill_chunk, either without the warm-up's check of long runs (asr.js longRunsAgree); else checked
 * @property {import('./probe.js').GpuValidation | null} [gpuValidation] onnxruntime-web's validationMode (probe.js)
 * @property {string | null} [optimization] the sessions' graphOptimizationLevel, one of GRAPH_OPTIMIZATIONS ('all'
 *   where unset or unknown)
 * @property {string | null} [weights] 'shared': on WebGPU the decoder's shared-weights forms, its weights uploaded once
 *   for both its sessions (runtime/weights.js), where the build made them; else each session holds its own
 * @property {boolean} [warmShapes] true: warm every shape class on a software GPU too (Recogniser.warmUp)
 * @property {boolean} [warmLong] false: the warm-up leaves out the longest chunk (its encoder run and prompt), which a
 *   first clip that long then compiles; a decode's calls and times are the same (a bench of the decode alone)
 * @property {(manifest: LoadedManifest) => void} [onManifest]
 * @property {(p: SiteProgress) => void} [onProgress]
 * @property {(w: import('./loader.js').LoadWarning) => void} [onWarning]
 */
/** @typedef {{ep: 'webgpu' | 'wasm', variant: string}} EpChoice */
/** @typedef {{manifest: LoadedManifest, runtime: Runtime, loading: LoadOptions, ortModule: Promise<Ort>}} OpenSite */
/** @typedef {Awaited<ReturnType<typeof loadSite>>} Site  a loaded site */

// Options: forceEp ('wasm': the CPU variant whatever the device offers; 'webgpu': WebGPU even on a
// software GPU; else WebGPU on a hardware GPU, wasm otherwise); variant (instead of the
// choice for this device); threads (wasm threads; by default wasmThreads' rule where the page is
// cross-origin isolated, else 1); fallback (to wasm when a WebGPU session fails; default true); onManifest(manifest);
// onProgress and onWarning as loader.js calls them, onProgress also with phases 'session' and 'warmup'.
// gpu in the result: probe.js probeWebGPU()'s.
// Returns {ort, manifest, runtime, gpu, ep, variant, notice, recogniser, modelBytes, load: {*_ms}, loading, cached,
// threadsWhy} (threadsWhy: why the wasm EP runs the threads it does, wasmThreads' why)
// (cached: settles once the model's cache writes are made, after the load's end)
// (loading: the loader's options and cache store, for the adapters' files: lora.js switchLora).
/**
 * @param {string | URL} manifestUrl
 * @param {SiteOptions} [opts]
 */
export async function loadSite(manifestUrl, opts = {}) {
  const t0 = performance.now();
  opts.onProgress?.({ phase: 'manifest', loaded: 0, total: 1 }); // the steps before the download, named: a stall shows where
  // the GPU probe (an adapter and a device) beside the manifest's and onnxruntime-web's fetches: neither needs the other
  const probed = probeWebGPU();
  const site = await openSite(manifestUrl, opts);
  const { manifest, runtime } = site;
  opts.onProgress?.({ phase: 'gpu', loaded: 0, total: 1 });
  const gpu = await probed;
  const pick = chooseVariant(manifest, gpu, opts.forceEp, Object.keys(runtime.variants));
  const threads = wasmThreads(opts.threads);
  const variant = opts.variant ?? pick.variant;
  if (pick.ep === 'wasm') refuseUnfit(manifest, variant);
  const shared = [runtime.files.tokens, runtime.files.ort_wasm, ...(runtime.vad ? [runtime.vad.file] : [])];
  const tLoad = performance.now();
  // a software GPU compiles and runs every shape class on the CPU (about 30 s more per load for the example on
  // SwiftShader): there a first clip of a new class pays for its own pipelines instead
  const shapes = !gpu.software || Boolean(opts.warmShapes);
  // each session is made as soon as its graph's files are verified, while the rest still download
  // in the order the sessions need them: onnxruntime-web's wasm, the encoder's files, then the rest; the shards
  // are fetched, checked and cached by the loader's own worker (in this thread where it cannot start), so that
  // making the sessions here does not hold up the download. The cache writes wait for the sessions (deferCache):
  // they would slow the download (on a 2-core box, BENCHMARKS.md), and the Cache API's reads stalled for good in
  // Chromium while a session was being made in their thread.
  const entry = manifest.variants[variant];
  const first = Object.values(variantGraphs(entry, runtime.roles).encoder).filter((n) => typeof n === 'string');
  // On wasm the sessions' weights sit in the tab beside the files (the tab's peak, BENCHMARKS.md "0.6b on the wasm
  // EP: memory"): the held writes' copies go sooner there.
  const load = startLoadInWorker(manifest, [runtime.files.ort_wasm, ...first, ...entry.files, ...shared],
    { ...site.loading, deferCache: true, ...(pick.ep === 'wasm' && { maxHeldBytes: WASM_MAX_HELD_BYTES }) });
  load.done.catch(() => {}); // its failure is verified's, awaited below
  load.verified.then(() => opts.onProgress?.({ phase: 'session', loaded: 0, total: 1, ep: pick.ep }), () => {});
  const ort = await site.ortModule;
  let made;
  let tSession0 = 0;
  try {
    configureOrt(ort, await load.ready(runtime.files.ort_wasm), threads.count);
    tSession0 = performance.now();
    made = await createRecogniser({ ...site, ort }, { ep: pick.ep, variant, load, gpu,
      graphCapture: opts.graphCapture ?? true, warmShapes: shapes, warmLong: opts.warmLong ?? true,
      validation: opts.gpuValidation, optimization: graphOptimization(opts.optimization),
      sharedWeights: opts.weights === 'shared' }, opts.fallback ?? true);
    await load.verified; // every shard verified (the sessions may not have needed them all)
  } finally {
    load.flushCache(); // the sessions are made (or failed): the cache writes go on meanwhile
  }
  // speech detection (runtime/vad.js), on wasm whatever the model's EP: a session of 2.3 MB, made in milliseconds
  const policy = runtime.vad;
  const vad = policy ? await made.recogniser.timed('speech detection session',
    async () => createVad(ort, await load.ready(policy.file), policy)) : null;
  const tSession = performance.now();
  opts.onProgress?.({ phase: 'warmup', loaded: 0, total: 1, ep: made.ep });
  made.recogniser.runsRequest = ['whole', 'chunked'].includes(opts.prefillRuns ?? '')
    ? /** @type {'whole' | 'chunked'} */ (opts.prefillRuns) : null;
  made.recogniser.formRequest = decodeRequest({ graphCapture: opts.graphCapture, decodeForm: opts.decodeForm,
    known: opts.knownDecode, software: Boolean(gpu.software), gpu: gpu.description ?? '', model: manifest.model_id });
  await made.recogniser.warmUp({ shapes });
  const tWarm = performance.now();
  const { stats } = load;
  return {
    ...made, ort, manifest, runtime, gpu, loading: site.loading, vad,
    notice: [made.notice ?? choiceNotice(pick, gpu, opts.forceEp),
      made.ep === 'wasm' ? memoryNotice(manifest.variants[made.variant]?.wasm, deviceMemory()) : null]
      .filter(Boolean).join(' ') || null,
    warmShapes: shapes, // whether the warm-up warmed every shape class (a later warm-up does as this one)
    threadsWhy: threads.why,
    // whether the model is kept in the browser's cache for the next visit (false: no cache, or storage full)
    cached: load.done.then(() => load.stats.kept, () => false),
    modelBytes: manifest.variants[made.variant].files.reduce((n, f) => n + manifest.files[f].size, 0),
    // milestones from the start (download_ms, verified_ms, total_ms) and the parts' own times (hash_ms: the
    // digests, summed; session_ms: from the first session's start to the last one's end, overlapping the download)
    load: {
      download_ms: tLoad - t0 + stats.download_ms, hash_ms: stats.hash_ms, verified_ms: tLoad - t0 + stats.verified_ms,
      // the shards read from the browser's cache (cache_ms: until the last of them) and those downloaded
      cache_ms: stats.cache_ms && tLoad - t0 + stats.cache_ms, cache_bytes: stats.cache_bytes, network_bytes: stats.network_bytes,
      session_ms: tSession - tSession0, warmup_ms: tWarm - tSession, total_ms: tWarm - t0,
      encoder_warmup_ms: made.recogniser.encoderWarmMs, // within session_ms: between the encoder's session and the decoder's
      int8_ms: made.recogniser.int8Ms, // within session_ms: deriving an int8 wasm twin's weights (runtime/int8.js)
      // within warmup_ms: the check of a long prefill run, and the measurement of the decode forms
      runs_check_ms: made.recogniser.runsCheckMs, decode_form_ms: made.recogniser.formMs,
    },
    // the recogniser's steps (files awaited, sessions, warm-up runs), ms from the start: where the load's time goes;
    // loadOrigin: the start, performance.now() in this thread (a bench lines up its own stamps with the steps)
    loadOrigin: t0,
    loadTimeline: made.recogniser.timeline.map(({ step, start, end }) =>
      ({ step, start_ms: Math.round(start - t0), end_ms: Math.round(end - t0) })),
  };
}

// Why the page runs on wasm when it was not asked to (null otherwise), in plain words (the technical reason
// stays in the probe's `reason`).
/**
 * @param {EpChoice} pick
 * @param {GpuProbe} gpu
 * @param {string | null} [forceEp]
 */
export function choiceNotice(pick, gpu, forceEp) {
  if (pick.ep !== 'wasm' || forceEp === 'wasm') return null;
  if (gpu.gpuAdapter && gpu.software) {
    return `This browser offers only a software imitation of a GPU here (${gpu.description}), slower than the CPU, ` +
      'so the model runs on the CPU. To try it anyway, add ?ep=webgpu to the address.';
  }
  return "This browser can't use the GPU here, so the model runs on the CPU (slower).";
}

// navigator.deviceMemory (GiB) where the browser gives it (Chromium's; not in TypeScript's DOM types)
const deviceMemory = () => /** @type {{deviceMemory?: number} | undefined} */ (globalThis.navigator)?.deviceMemory;

// Where the device says it has less memory than the build estimates the tab needs on wasm (the manifest entry's
// tab_bytes; navigator.deviceMemory, GiB, which browsers round and cap at 8), say so: the tab may run out of memory.
/**
 * @param {import('webbuild-types').WasmFit | undefined} wasm
 * @param {number | undefined} deviceGiB
 * @returns {string | null}
 */
export function memoryNotice(wasm, deviceGiB) {
  if (!wasm?.tab_bytes || !deviceGiB || deviceGiB * 2 ** 30 >= wasm.tab_bytes) return null;
  return `This model needs up to ${(wasm.tab_bytes / 2 ** 30).toFixed(1)} GiB of memory on the CPU; this device ` +
    `reports about ${deviceGiB} GiB, so the page may run out of memory.`;
}

// The build's estimate of a variant's wasm memory (manifest entry `wasm`, webbuild/pipeline/wasm_budget.py):
// where it exceeds what a tab gets, say so before downloading rather than fail with std::bad_alloc.
/**
 * @param {import('webbuild-types').Manifest} manifest
 * @param {string} variant
 */
export function refuseUnfit(manifest, variant) {
  const wasm = manifest.variants[variant]?.wasm;
  if (!wasm || wasm.fits !== false) return;
  /** @param {number} n bytes */
  const gib = (n) => (n / 2 ** 30).toFixed(1);
  throw new Error(`This model needs WebGPU: its WebAssembly fallback needs ${gib(wasm.need_bytes)} GiB, ` +
    `more than the ${gib(wasm.budget_bytes)} GiB a browser tab gets.`);
}

// The manifest, runtime.json and (a promise of) onnxruntime-web by the name runtime.json gives; the
// loader's options with one cache store for every download of this load.
/**
 * @param {string | URL} manifestUrl
 * @param {SiteOptions} opts
 * @returns {Promise<OpenSite>}
 */
async function openSite(manifestUrl, opts) {
  const manifest = await loadManifest(manifestUrl);
  opts.onManifest?.(manifest);
  /** @type {LoadOptions} */
  const loading = { onProgress: opts.onProgress, onWarning: opts.onWarning };
  loading.cache = await openModelCache(manifest.model_id, loading);
  // no progress events: the page's bar shows the model's bytes
  const bytes = (await loadFiles(manifest, [RUNTIME_FILE], { ...loading, onProgress: undefined })).get(RUNTIME_FILE);
  /** @type {Runtime} */
  const runtime = JSON.parse(new TextDecoder().decode(bytes));
  const ortModule = import(new URL(`../${runtime.files.ort_module}`, import.meta.url).href);
  return { manifest, runtime, loading, ortModule };
}

// A manifest variant entry ({files, requires, dtype, providers, encoder: 'encoder.fp16.onnx', decoder_data: ...}) as
// the recogniser takes it: its file names by graph, through runtime.json's role table; with the shapes
// of the adapters' inputs (lora) where the variant has an adapted decoder and the build adapters.
/**
 * @param {import('webbuild-types').ManifestVariant} entry
 * @param {Runtime['roles']} roles
 * @param {import('webbuild-types').Manifest | null} [manifest]
 * @returns {Graphs}
 */
export function variantGraphs(entry, roles, manifest = null) {
  const graphs = /** @type {Graphs} */ ({ dtype: entry.dtype }); // the graphs set below
  for (const [graph, table] of Object.entries(roles)) {
    // a role names a file of the entry
    const names = /** @type {GraphFiles} */ (Object.fromEntries(Object.entries(table).map(([kind, role]) => [kind, entry[role]])));
    if (graph !== 'decoder_lora' || names.graph) /** @type {Record<string, GraphFiles>} */ (/** @type {unknown} */ (graphs))[graph] = names; // the adapted decoder: builds with adapters
  }
  if (graphs.decoder_lora) Object.assign(graphs, { lora: loraShapes(manifest), loraLayout: entry.lora_layout ?? {} });
  return graphs;
}

// The decoder's graphs in their shared-weights forms (webbuild/forms/shared_weights.py), with the weights they take
// as inputs, where the variant has them for the graph and its step form alike; else as they are.
/** @param {GraphFiles} decoder @param {import('webbuild-types').ManifestVariant} entry @returns {GraphFiles} */
export function sharedForms(decoder, entry) {
  const { weights } = entry;
  if (!decoder.shared || !weights || (decoder.step && !decoder.step_shared)) return decoder;
  return { ...decoder, graph: decoder.shared, step: decoder.step_shared, weights };
}

// The wasm EP's threads, {count, why}: `requested` (the page's ?threads=, the bench's --threads) as asked, else
// threadsFor() this device's logical processors. Threads need SharedArrayBuffer, which a browser gives only a
// cross-origin isolated page (COOP/COEP headers, sent by the host or added by the site's service worker,
// isolation-sw.js): elsewhere 1. Node has no `crossOriginIsolated` at all and takes what is asked.
/** @param {number} [requested] */
export function wasmThreads(requested) {
  if (globalThis.crossOriginIsolated === false) return { count: 1, why: 'not cross-origin isolated' };
  if (requested) return { count: requested, why: 'as asked' };
  const cores = globalThis.navigator?.hardwareConcurrency || 1;
  return { count: threadsFor(cores), why: `${cores} logical processor${cores === 1 ? '' : 's'}` };
}

// onnxruntime's own guidance: native onnxruntime's intra-op pool defaults to the physical cores, and
// onnxruntime-web's default, min(4, ceil(n / 2)), halves the logical processors for the same reason (SMT
// siblings share a core's SIMD units; a phone's little cores hold back the pool, which splits work evenly).
// Two differences here: the model runs in its own worker, so the page's thread does not compete, and 2
// logical processors (a 2-core machine: SMT ones report 4 or more) run 2 threads; and the cap is 8, not 4
// (sokuji's 0.6b page runs 8). The 0.6b on a 16-core host (BENCHMARKS.md, "wasm threads"): 1, 4, 8, 16 threads
// gave 288, 115, 89, 87 ms per token, so the rule's 8 there is the fastest measured; the tiny example is too
// small to gain from threads at all.
/** @param {number} cores navigator.hardwareConcurrency */
export function threadsFor(cores) {
  return Math.max(1, Math.min(cores, Math.max(2, Math.min(8, Math.ceil(cores / 2)))));
}

// onnxruntime-web's graph optimization levels (SessionOptions.graphOptimizationLevel), 'all' its default
export const GRAPH_OPTIMIZATIONS = /** @type {const} */ (['disabled', 'basic', 'extended', 'all']);

// The sessions' graphOptimizationLevel: `asked` where it is one (the page's ?opt=), else 'all'.
/** @param {string | null | undefined} asked @returns {import('./asr.js').GraphOptimization} */
export function graphOptimization(asked) {
  return GRAPH_OPTIMIZATIONS.find((level) => level === asked) ?? 'all';
}

const WASM_MAX_HELD_BYTES = 64 * 2 ** 20; // the loader's held cache copies on wasm (loader.js MAX_HELD_BYTES: 512 MiB)

/**
 * @param {Ort} ort
 * @param {Uint8Array} wasmBinary
 * @param {number} threads
 */
function configureOrt(ort, wasmBinary, threads) {
  ort.env.wasm.wasmBinary = wasmBinary; // from the verified shards: no second download
  ort.env.wasm.numThreads = threads;
  ort.env.logLevel = 'error';
}

// WebGPU first; a session that fails there (missing kernel, lost device) falls back to wasm
// with a notice instead of leaving the page dead. The fallback runs the wasm EP's own variant
// (fp32 and its twin graphs; the fp16 graphs have int4 lookups wasm cannot run), fetched only then.
/**
 * @param {OpenSite & {ort: Ort}} site
 * @param {{ep: 'webgpu' | 'wasm', variant: string, load: import('./loader.js').Load, gpu: GpuProbe, graphCapture: boolean,
 *   warmShapes: boolean, warmLong: boolean, validation?: import('./probe.js').GpuValidation | null,
 *   optimization: import('./asr.js').GraphOptimization, sharedWeights: boolean}} choice sharedWeights: the decoder's
 *   shared-weights forms on WebGPU where the variant has them (sharedForms); warmShapes:
 *   the warm-up will warm every shape class (its encoder part then runs as soon as the encoder's session is made),
 *   the longest chunk's with warmLong; validation: the
 *   WebGPU sessions' validationMode (probe.js webgpuProvider)
 * @param {boolean} fallback
 * @returns {Promise<EpChoice & {recogniser: Recogniser, notice?: string}>}
 */
async function createRecogniser(site, { ep, variant, load, gpu, graphCapture, warmShapes, warmLong, validation, optimization,
  sharedWeights }, fallback) {
  const { ort, manifest, runtime, loading } = site;
  // the load's files, each once the sessions that read it are made (on wasm: asr.js); looked up at each call, as a
  // load that moves into this thread replaces its release
  const release = (/** @type {string} */ name) => load.release(name);
  /**
   * @param {string} v the variant
   * @param {import('./asr.js').Files} vFiles
   * @param {import('./asr.js').Provider} provider
   * @param {(names: string[]) => Promise<unknown>} [ready]
   */
  const create = (v, vFiles, provider, ready) => {
    const graphs = variantGraphs(manifest.variants[v], runtime.roles, manifest);
    if (sharedWeights && provider !== 'wasm') graphs.decoder = sharedForms(graphs.decoder, manifest.variants[v]);
    if (!graphCapture) { // every decode step plain (runtime/capture.js)
      delete graphs.decoder.step;
      if (graphs.decoder_lora) {
        delete graphs.decoder_lora.step;
        delete graphs.decoder_lora.delta; // what makes the step's merged updates
      }
    }
    return Recogniser.create(ort, vFiles, graphs, runtime, provider, ready, { warmShapes, warmLong, release, optimization });
  };
  try {
    const provider = ep === 'webgpu' ? await webgpuProvider(gpu.gpuAdapter, validation ?? undefined) : ep;
    const started = startOrt(ort, provider); // while the encoder's files download; the first session waits for it
    const ready = (/** @type {string[]} */ names) => Promise.all([started, ...names.map((n) => load.ready(n))]);
    const recogniser = await create(variant, load.files, provider, ready);
    const { start, end, error } = await started;
    recogniser.timeline.unshift({ step: error ? `onnxruntime start (failed: ${error})` : 'onnxruntime start', start, end });
    return { ep, variant, recogniser };
  } catch (e) {
    const files = await load.verified; // a shard that failed is the error, not a reason to fall back
    if (ep !== 'webgpu' || !fallback) throw e;
    const wasm = chooseVariant(manifest, gpu, 'wasm', Object.keys(runtime.variants)).variant;
    refuseUnfit(manifest, wasm);
    const wasmFiles = wasm === variant ? files : await loadFiles(manifest, manifest.variants[wasm].files, loading);
    return { ep: 'wasm', variant: wasm, recogniser: await create(wasm, wasmFiles, 'wasm'),
      notice: `The GPU could not run this model (${e.message}), so it runs on the CPU instead (slower).` };
  }
}

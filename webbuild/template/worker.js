// Module worker that owns the model: loads it (runtime/site.js: shards, EP + variant, sessions,
// warm-up) and transcribes. The page only talks to it by the messages of runtime/contract.js.
// A lost GPU device (a driver reset, a tab in the background) marks the model dead; it is loaded again on the
// CPU, and a transcription under way goes on from the chunk the loss interrupted, its text so far kept.

// first: it watches onnxruntime-web's wasm memory from its instantiation on
import { wasmHeapBytes } from './runtime/heap.js';
import { FROM_WORKER, TO_WORKER } from './runtime/contract.js';
import { clearCache } from './runtime/loader.js';
import { loadSite } from './runtime/site.js';
import { DEFAULT_CHUNKING, splitAtQuiet, stretches, toSpeech } from './runtime/chunk.js';
import { loraAbout, loraNames, switchLora } from './runtime/lora.js';
import { LiveSession } from './runtime/live.js';
import { loadErrorMessage, warningMessage } from './runtime/explain.js';

/** @typedef {import('./runtime/contract.js').ToWorkerMessage} ToWorkerMessage */
/** @typedef {import('./runtime/contract.js').FromWorkerMessage} FromWorkerMessage */
/** @typedef {import('./runtime/asr.js').Transcript} Transcript */

/** @type {import('./runtime/site.js').Site | null} */
let site = null;
/** @type {string | null} */
let modelId = null;
/** @type {string | null} */
let lora = null; // the LoRA adapter on (runtime/lora.js), null: the base model
/** @type {{id: number, session: LiveSession} | null} */
let live = null; // the live transcription under way
/** @type {import('./runtime/loader.js').LoadedManifest | null} */
let manifest = null; // the messages name its files (runtime/explain.js)
/** @type {import('./runtime/contract.js').LoadMessage | null} */
let loadMessage = null; // the load's options, for loading again after a lost device
let cancelled = 0; // the id of the transcription asked to stop
/** @type {Promise<void>} */
let recovering = Promise.resolve(); // loading again after a lost device
/** @type {WeakSet<import('./runtime/site.js').Site>} */
const dead = new WeakSet(); // sites whose GPU device was lost
/** @type {WeakMap<import('./runtime/site.js').Site, Promise<GPUDeviceLostInfo>>} */
const losses = new WeakMap(); // each WebGPU site's device.lost

const post = (/** @type {FromWorkerMessage} */ msg) => self.postMessage(msg);

// One message at a time: an adapter switch waits for the transcription under way, which finishes with the
// adapter it began with (a switch rewrites the adapted sessions' inputs in place). A cancel is read at once.
let queue = Promise.resolve();
self.onmessage = (/** @type {MessageEvent<ToWorkerMessage>} */ { data }) => {
  if (data.type === TO_WORKER.cancel) cancelled = data.id;
  else queue = queue.then(() => handle(data));
};

/** @param {ToWorkerMessage} data */
async function handle(data) {
  try {
    if (data.type === TO_WORKER.load) await load(data);
    else if (data.type === TO_WORKER.transcribe) await transcribe(data);
    else if (data.type === TO_WORKER.setLora) await setLora(data);
    else if (data.type === TO_WORKER.liveStart) await liveStart(data);
    else if (data.type === TO_WORKER.liveAudio) live?.session.push(data.frames, data.capturedAt);
    else if (data.type === TO_WORKER.liveStop) await liveStop(data);
    else if (data.type === TO_WORKER.clearCache) {
      // no model id where loading failed before the manifest came: no cache of it to name
      post({ type: FROM_WORKER.cacheCleared, existed: modelId ? await clearCache(modelId) : false });
    }
  } catch (e) {
    // id: the transcription or adapter switch that failed (a load or clear-cache message has none)
    postError(e, /** @type {{id?: number}} */ (data).id);
  }
}

// An error for the page: the visitor's words (a shard named by its model file), and the error as thrown, which
// the console keeps as a warning: the page shows the error itself, and some are the answer a visitor should get
// (a model that needs WebGPU on a browser without it), which a console check must not take for a fault.
/** @param {any} e a caught error: anything may have been thrown @param {number} [id] */
function postError(e, id) {
  const detail = e?.message ?? String(e);
  console.warn(`[webbuild] ${detail}`);
  post({ type: FROM_WORKER.error, id, message: loadErrorMessage(e, manifest), detail });
}

// While a load runs: a sign that this thread runs, for the page's watch (app/watched-worker.js), which tells a
// blocked thread from a long step.
const ALIVE_MS = 2000;

/** @param {import('./runtime/contract.js').LoadMessage} msg */
async function load(msg) {
  loadMessage = msg;
  const alive = setInterval(() => post({ type: FROM_WORKER.alive }), ALIVE_MS);
  let loaded;
  try {
    loaded = site = await startSite(msg, msg.forceEp);
  } finally {
    clearInterval(alive);
  }
  post({ type: FROM_WORKER.ready, info: readyInfo(loaded) });
  loaded.cached.then((kept) => post({ type: FROM_WORKER.cached, kept })); // not awaited: transcriptions need not wait for it
}

// loadSite with the page's options, its progress and warnings posted (a warning in the visitor's words, or only
// in the console); the lost GPU device of a WebGPU site watched.
/** @param {import('./runtime/contract.js').LoadMessage} msg @param {string | null | undefined} forceEp */
async function startSite({ manifestUrl, graphCapture, warmShapes, warmLong, decodeForm, knownDecode, prefillRuns, gpuValidation,
  threads, optimization, weights },
  forceEp) {
  const said = new Set(); // the warnings said once a load (a full storage fails every write)
  const loaded = await loadSite(manifestUrl, {
    forceEp,
    graphCapture,
    warmShapes,
    warmLong,
    decodeForm,
    knownDecode,
    prefillRuns,
    gpuValidation,
    threads,
    optimization,
    weights,
    onManifest: (m) => { manifest = m; modelId = m.model_id; },
    onProgress: (e) => post({ type: FROM_WORKER.progress, ...e }),
    onWarning: (w) => {
      console.warn(`[webbuild] ${w.message}`);
      const message = warningMessage(w, manifest);
      if (message && !said.has(message)) post({ type: FROM_WORKER.warning, message, code: w.code, shard: w.shard });
      if (w.code !== 'retry') said.add(message);
    },
  });
  await watchDevice(loaded);
  return loaded;
}

// On WebGPU: the device's loss marks the site dead and loads the model again on the CPU.
/** @param {import('./runtime/site.js').Site} watched */
async function watchDevice(watched) {
  const device = await watched.recogniser.gpuDevice();
  if (!device) return;
  losses.set(watched, device.lost);
  device.lost.then((info) => {
    dead.add(watched);
    if (site !== watched) return; // a site already replaced
    recovering = recover(info);
    recovering.catch((e) => postError(e));
  });
}

// The model loaded again after the GPU device was lost: on the CPU, where nothing can be lost, with the adapter
// that was on. The page hears of the loss at once and of the new model once it is ready.
/** @param {GPUDeviceLostInfo} info */
async function recover(info) {
  post({ type: FROM_WORKER.warning, code: 'device-lost',
    message: `The GPU stopped working (${info.message || info.reason || 'device lost'}). The model is being loaded again on the ` +
      'CPU (WebAssembly), which is slower; the transcript so far is kept.' });
  const loaded = await startSite(/** @type {import('./runtime/contract.js').LoadMessage} */ (loadMessage), 'wasm');
  if (lora) lora = await switchLora(loaded, lora, loaded.loading);
  site = loaded;
  post({ type: FROM_WORKER.recovered, info: readyInfo(loaded) });
}

// The loaded site's description for the page (contract.js ReadyInfo).
/** @param {import('./runtime/site.js').Site} loaded @returns {import('./runtime/contract.js').ReadyInfo} */
function readyInfo(loaded) {
  const { ep, gpu, recogniser, manifest: m } = loaded;
  return {
    ep, variant: loaded.variant, notice: loaded.notice,
    // description: probe.js sets it wherever there is an adapter, as on webgpu; numThreads: site.js sets it
    gpu: ep === 'webgpu' ? /** @type {string} */ (gpu.description) : 'none (WebAssembly on the CPU)',
    shaderF16: Boolean(gpu.shaderF16), threads: /** @type {number} */ (loaded.ort.env.wasm.numThreads), threadsWhy: loaded.threadsWhy,
    kvCache: recogniser.kvLocation, sharedWeights: Object.keys(recogniser.weights).length,
    decode: recogniser.decodeMode,
    decodeChoice: recogniser.decodeChoice, // runtime/decode-form.js: the form and, where measured, both forms' ms per token
    // tokens per prefill run (0: the whole prompt) and what the warm-up's check of long runs measured
    prefillRuns: { limit: recogniser.prefillRunLimit, check: recogniser.longRunsCheck },
    modelBytes: loaded.modelBytes, load: loaded.load, loadTimeline: loaded.loadTimeline, loadOrigin: loaded.loadOrigin, wasmHeapBytes: wasmHeapBytes(),
    // the adapters only where the recogniser loaded the adapted decoder (the variant has its graphs)
    loraAdapters: recogniser.adapted ? loraNames(m) : [], loraAbout: loraAbout(m), lora,
    languages: Object.keys(recogniser.rt.prompt.languages ?? {}), language: recogniser.rt.prompt.language ?? 'auto',
    // the context field: model.yaml's text, shown only where the page can tokenise text for this model
    context: recogniser.rt.prompt.context?.text ?? '', takesContext: Boolean(recogniser.rt.prompt.context),
  };
}

// The site to run on: the one loaded again where the GPU device was lost.
async function current() {
  await recovering;
  if (!site) throw new Error('the model is not loaded yet');
  return site;
}

// The adapter's file through the loader (its shards only; progress tagged with its name), then its
// values into the adapted sessions' inputs.
/** @param {import('./runtime/contract.js').SetLoraMessage} msg */
async function setLora({ id, name }) {
  const site = await current();
  // called only while switchLora loads adapter `name`'s file (it loads none for the base model)
  const onProgress = (/** @type {import('./runtime/loader.js').Progress} */ e) =>
    post({ type: FROM_WORKER.progress, ...e, lora: /** @type {string} */ (name) });
  lora = await switchLora(site, name || null, { ...site.loading, onProgress });
  post({ type: FROM_WORKER.loraSet, id, name: lora });
}

// The audio's chunks one at a time, each announced (the page's "chunk i of n"); a cancel stops it after the
// current chunk or decode step, with the chunks so far (the last perhaps cut short).
/** @param {import('./runtime/contract.js').TranscribeMessage} msg */
async function transcribe({ id, pcm, maxNewTokens, chunkSeconds, language = null, context = '' }) {
  const { runtime, vad } = await current();
  const policy = chunkPolicy(runtime, chunkSeconds);
  const tVad = performance.now();
  // with speech detection, the chunks' parts within stretches of speech (chunk.js toSpeech): none without speech
  const chunks = vad ? toSpeech(splitAtQuiet(pcm, runtime.sample_rate, policy),
    stretches(await vad.segments(pcm), Math.round(vad.policy.merge_seconds * vad.policy.sample_rate)), runtime.sample_rate, policy)
    : splitAtQuiet(pcm, runtime.sample_rate, policy);
  const vadMs = vad ? performance.now() - tVad : null;
  /** @type {string[]} */
  const texts = [];
  /** @type {Transcript[]} */
  const results = [];
  const stop = () => cancelled === id;
  for (const [index, [start, end]] of chunks.entries()) {
    // a wasm decode never leaves the microtask queue, so a cancel is read here, between chunks, where the
    // worker's messages get their turn (a WebGPU decode waits for the GPU: there it is read between steps too)
    await new Promise((resolve) => setTimeout(resolve, 0));
    if (index && stop()) break; // the first chunk gives at least its first token
    post({ type: FROM_WORKER.chunk, id, index, count: chunks.length, start, end });
    const r = await transcribeChunk(pcm.subarray(start, end), {
      maxNewTokens: maxNewTokens ?? runtime.max_new_tokens, stop, language, context,
      onToken: (text, token) =>
        post({ type: FROM_WORKER.token, id, token, text: [...texts, text].filter(Boolean).join(' ') }),
    });
    texts.push(r.text);
    results.push(r);
  }
  post({ type: FROM_WORKER.done, id, text: texts.filter(Boolean).join(' '), texts, chunks: chunks.slice(0, results.length),
    tokens: results.map((r) => r.tokens), margins: results.map((r) => r.margins), metrics: summarise(results, pcm.length, runtime.sample_rate, vadMs), lora,
    cancelled: stop(), audioChunks: chunks.length, language: results.map((r) => r.language).find(Boolean) ?? null });
}

// One chunk on the current site; where its GPU device is lost meanwhile, the chunk again once the model is loaded
// again (a decode on a lost device may fail, or never end: the loss ends the wait).
/**
 * @param {Float32Array} pcm
 * @param {Parameters<import('./runtime/asr.js').Recogniser['transcribe']>[1]} options
 * @returns {Promise<Transcript>}
 */
async function transcribeChunk(pcm, options) {
  for (;;) {
    const on = await current();
    const lost = losses.get(on);
    const run = on.recogniser.transcribe(pcm, options);
    run.catch(() => {}); // on a lost device it may fail after the race is over
    try {
      return await (lost ? Promise.race([run, lost.then((info) => { throw new Error(`GPU device lost (${info.reason})`); })]) : run);
    } catch (e) {
      // an error of the lost device comes before device.lost resolves: wait a little for it
      if (lost) await Promise.race([lost, new Promise((resolve) => setTimeout(resolve, LOSS_WAIT_MS))]);
      if (!dead.has(on)) throw e;
    }
  }
}
const LOSS_WAIT_MS = 1000;

// A live session (runtime/live.js): the frames go in as they come; its texts go to the page as they are made.
/** @param {import('./runtime/contract.js').LiveStartMessage} msg */
async function liveStart({ id, rate, context = '', language = null }) {
  const site = await current();
  // a context too long or a language the model lacks fails here, before the microphone's audio comes
  site.recogniser.contextPrefix(context);
  site.recogniser.forcedPrefix(language);
  const session = new LiveSession(site.recogniser, site.runtime, {
    rate, ep: site.ep, context, language, vad: site.vad, onUpdate: (update) => post({ type: FROM_WORKER.liveUpdate, id, update }),
  });
  live = { id, session };
}

/** @param {import('./runtime/contract.js').LiveStopMessage} msg */
async function liveStop({ id }) {
  if (live?.id !== id) throw new Error('no live transcription is under way');
  const { session } = live;
  const metrics = await session.stop();
  live = null;
  const finals = session.updates.filter((u) => u.final);
  post({ type: FROM_WORKER.liveDone, id, text: finals.map((u) => u.text).filter(Boolean).join(' '),
    tokens: finals.map((u) => u.tokens), margins: finals.map((u) => u.margins),
    chunks: finals.map((u) => [u.start, u.end]), metrics });
}

// runtime.json's chunking (older sites: their max_chunk_seconds), its length capped by the page's ?chunk_seconds.
/**
 * @param {import('webbuild-types').Runtime} runtime
 * @param {number} [chunkSeconds]
 * @returns {import('./runtime/chunk.js').ChunkPolicy}
 */
function chunkPolicy(runtime, chunkSeconds) {
  const max = runtime.max_chunk_seconds;
  const policy = runtime.chunking ?? { ...DEFAULT_CHUNKING, max_seconds: max, min_seconds: max / 2, join_seconds: max };
  if (!chunkSeconds) return policy;
  return { ...policy, max_seconds: chunkSeconds, min_seconds: chunkSeconds / 2, join_seconds: Math.min(policy.join_seconds, chunkSeconds) };
}

// Per-transcription metrics over all chunks: TTFT is the first chunk's; rates are totals, over the whole audio
// (with speech detection the chunks may leave parts out; audio without speech has no chunk at all).
/**
 * @param {Transcript[]} results
 * @param {number} samples @param {number} rate @param {number | null} vadMs the speech detection's time (null: off)
 * @returns {import('./runtime/contract.js').TranscriptionMetrics}
 */
function summarise(results, samples, rate, vadMs) {
  const sum = (/** @type {keyof Transcript['timings']} */ k) => results.reduce((n, r) => n + r.timings[k], 0);
  const t = results[0]?.timings ?? { ttft_ms: 0 };
  const audioMs = (samples / rate) * 1000; // the whole audio's, the parts not transcribed too
  return {
    chunks: results.length,
    encoder_ms: sum('encoder_ms'),
    ttft_ms: t.ttft_ms,
    prompt_tokens: sum('prompt_tokens'),
    prefill_tokens_per_s: results.length ? (sum('prompt_tokens') / sum('prefill_ms')) * 1000 : 0,
    decode_tokens: sum('decode_tokens'), // with decode_ms: webbuild verify's rate over many clips
    decode_ms: sum('decode_ms'),
    decode_tokens_per_s: sum('decode_tokens') ? (sum('decode_tokens') / sum('decode_ms')) * 1000 : null,
    generated_tokens: results.reduce((n, r) => n + r.tokens.length, 0),
    total_ms: sum('total_ms'),
    audio_ms: audioMs,
    rtf: sum('total_ms') / audioMs,
    vad_ms: vadMs,
    wasm_heap_bytes: wasmHeapBytes(), // the peak so far: a wasm memory only grows
  };
}

// Module worker that owns the model: loads it (runtime/site.js: shards, EP + variant, sessions,
// warm-up) and transcribes. The page only talks to it by the messages of runtime/contract.js.

import { FROM_WORKER, TO_WORKER } from './runtime/contract.js';
import { clearCache } from './runtime/loader.js';
import { loadSite } from './runtime/site.js';
import { DEFAULT_CHUNKING, splitAtQuiet } from './runtime/chunk.js';
import { loraAbout, loraNames, switchLora } from './runtime/lora.js';
import { LiveSession } from './runtime/live.js';

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

const post = (/** @type {FromWorkerMessage} */ msg) => self.postMessage(msg);

// One message at a time: an adapter switch waits for the transcription under way, which finishes with the
// adapter it began with (a switch rewrites the adapted sessions' inputs in place).
let queue = Promise.resolve();
self.onmessage = (/** @type {MessageEvent<ToWorkerMessage>} */ { data }) => {
  queue = queue.then(() => handle(data));
};

/** @param {ToWorkerMessage} data */
async function handle(data) {
  try {
    if (data.type === TO_WORKER.load) await load(data);
    else if (data.type === TO_WORKER.transcribe) await transcribe(data);
    else if (data.type === TO_WORKER.setLora) await setLora(data);
    else if (data.type === TO_WORKER.liveStart) liveStart(data);
    else if (data.type === TO_WORKER.liveAudio) live?.session.push(data.frames, data.capturedAt);
    else if (data.type === TO_WORKER.liveStop) await liveStop(data);
    else if (data.type === TO_WORKER.clearCache) {
      // no model id where loading failed before the manifest came: no cache of it to name
      post({ type: FROM_WORKER.cacheCleared, existed: modelId ? await clearCache(modelId) : false });
    }
  } catch (e) {
    // id: the transcription or adapter switch that failed (a load or clear-cache message has none)
    post({ type: FROM_WORKER.error, id: /** @type {{id?: number}} */ (data).id, message: e?.message ?? String(e) });
  }
}

/** @param {import('./runtime/contract.js').LoadMessage} msg */
async function load({ manifestUrl, forceEp, graphCapture, warmShapes, threads }) {
  site = await loadSite(manifestUrl, {
    forceEp,
    threads,
    graphCapture,
    warmShapes,
    onManifest: (manifest) => { modelId = manifest.model_id; },
    onProgress: (e) => post({ type: FROM_WORKER.progress, ...e }),
    onWarning: (w) => post({ type: FROM_WORKER.warning, message: w.message }),
  });
  const { ep, gpu } = site;
  post({
    type: FROM_WORKER.ready,
    info: {
      ep, variant: site.variant, notice: site.notice,
      // description: probe.js sets it wherever there is an adapter, as on webgpu; numThreads: site.js sets it
      gpu: ep === 'webgpu' ? /** @type {string} */ (gpu.description) : 'none (WebAssembly on the CPU)',
      shaderF16: Boolean(gpu.shaderF16), threads: /** @type {number} */ (site.ort.env.wasm.numThreads), threadsWhy: site.threadsWhy,
      kvCache: site.recogniser.kvLocation, decode: site.recogniser.decodeMode,
      // tokens per prefill run (0: the whole prompt) and what the warm-up's check of long runs measured
      prefillRuns: { limit: site.recogniser.prefillRunLimit, check: site.recogniser.longRunsCheck },
      modelBytes: site.modelBytes, load: site.load,
      // the adapters only where the recogniser loaded the adapted decoder (the variant has its graphs)
      loraAdapters: site.recogniser.adapted ? loraNames(site.manifest) : [], loraAbout: loraAbout(site.manifest), lora,
    },
  });
  site.cached.then(() => post({ type: FROM_WORKER.cached })); // not awaited: transcriptions need not wait for it
}

// The adapter's file through the loader (its shards only; progress tagged with its name), then its
// values into the adapted sessions' inputs.
/** @param {import('./runtime/contract.js').SetLoraMessage} msg */
async function setLora({ id, name }) {
  if (!site) throw new Error('the model is not loaded yet');
  // called only while switchLora loads adapter `name`'s file (it loads none for the base model)
  const onProgress = (/** @type {import('./runtime/loader.js').Progress} */ e) =>
    post({ type: FROM_WORKER.progress, ...e, lora: /** @type {string} */ (name) });
  lora = await switchLora(site, name || null, { ...site.loading, onProgress });
  post({ type: FROM_WORKER.loraSet, id, name: lora });
}

/** @param {import('./runtime/contract.js').TranscribeMessage} msg */
async function transcribe({ id, pcm, maxNewTokens, chunkSeconds }) {
  if (!site) throw new Error('the model is not loaded yet');
  const { recogniser, runtime } = site;
  const chunks = splitAtQuiet(pcm, runtime.sample_rate, chunkPolicy(runtime, chunkSeconds));
  /** @type {string[]} */
  const texts = [];
  /** @type {Transcript[]} */
  const results = [];
  for (const [start, end] of chunks) {
    const r = await recogniser.transcribe(pcm.subarray(start, end), {
      maxNewTokens: maxNewTokens ?? runtime.max_new_tokens,
      onToken: (text, token) =>
        post({ type: FROM_WORKER.token, id, token, text: [...texts, text].filter(Boolean).join(' ') }),
    });
    texts.push(r.text);
    results.push(r);
  }
  post({ type: FROM_WORKER.done, id, text: texts.filter(Boolean).join(' '), texts, chunks, tokens: results.map((r) => r.tokens),
    margins: results.map((r) => r.margins), metrics: summarise(results), lora });
}

// A live session (runtime/live.js): the frames go in as they come; its texts go to the page as they are made.
/** @param {import('./runtime/contract.js').LiveStartMessage} msg */
function liveStart({ id, rate }) {
  if (!site) throw new Error('the model is not loaded yet');
  const session = new LiveSession(site.recogniser, site.runtime, {
    rate, ep: site.ep, onUpdate: (update) => post({ type: FROM_WORKER.liveUpdate, id, update }),
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

// Per-transcription metrics over all chunks: TTFT is the first chunk's; rates are totals.
/**
 * @param {Transcript[]} results
 * @returns {import('./runtime/contract.js').TranscriptionMetrics}
 */
function summarise(results) {
  const sum = (/** @type {keyof Transcript['timings']} */ k) => results.reduce((n, r) => n + r.timings[k], 0);
  const t = results[0].timings;
  return {
    chunks: results.length,
    encoder_ms: sum('encoder_ms'),
    ttft_ms: t.ttft_ms,
    prompt_tokens: sum('prompt_tokens'),
    prefill_tokens_per_s: (sum('prompt_tokens') / sum('prefill_ms')) * 1000,
    decode_tokens: sum('decode_tokens'), // with decode_ms: webbuild verify's rate over many clips
    decode_ms: sum('decode_ms'),
    decode_tokens_per_s: sum('decode_tokens') ? (sum('decode_tokens') / sum('decode_ms')) * 1000 : null,
    generated_tokens: results.reduce((n, r) => n + r.tokens.length, 0),
    total_ms: sum('total_ms'),
    audio_ms: sum('audio_ms'),
    rtf: sum('total_ms') / sum('audio_ms'),
  };
}

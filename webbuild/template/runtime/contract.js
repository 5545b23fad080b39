// The JS half of the contract between the build and the site's runtime (webbuild/site/contract.py):
// the two file names the runtime knows before it reads runtime.json, where the build writes the rest
// (file roles, the graphs' input and output names, the variants' policy, onnxruntime-web's file names);
// and the messages between the page (app.js) and the model worker (worker.js).
// tests/test_site_runtime.py keeps the names equal to the Python ones.

export const RUNTIME_FILE = 'runtime.json'; // a logical file of the model manifest
export const SAMPLES_FILE = 'samples.json'; // beside index.html: the sample clips and their texts

// ---------------------------------------------------------------- graph names

// runtime.json's `io` (webbuild/site/contract.py IO): a name, or a template with %d (the layer) and %s
// (a word) for the per-layer ones, filled in order.
/**
 * @param {string} template
 * @param {...(string | number)} values
 */
export function fill(template, ...values) {
  let i = 0;
  return template.replace(/%[ds]/g, () => String(values[i++]));
}

// The decoder's KV cache names, per layer key then value: {past: its input, present: its output}.
/**
 * @param {import('webbuild-types').Runtime['io']} io
 * @param {number} layers
 */
export function kvNames(io, layers) {
  /** @type {{past: string, present: string}[]} */
  const out = [];
  for (let i = 0; i < layers; i++) {
    out.push({ past: fill(io.past_key, i), present: fill(io.present_key, i) });
    out.push({ past: fill(io.past_value, i), present: fill(io.present_value, i) });
  }
  return out;
}

// ---------------------------------------------------------------- page -> worker

/**
 * @typedef {{type: 'load', manifestUrl: string, forceEp?: string | null, threads?: number, graphCapture?: boolean,
 *   warmShapes?: boolean, warmLong?: boolean, decodeForm?: string | null, knownDecode?: import('./decode-form.js').DecodeChoice | null,
 *   prefillRuns?: string | null, gpuValidation?: import('./probe.js').GpuValidation | null,
 *   optimization?: string | null, weights?: string | null}} LoadMessage
 *   Load the model once (forceEp: the page's ?ep=; threads: its ?threads=, the wasm EP's threads, else site.js
 *   wasmThreads' rule). 'wasm' runs the CPU variant whatever the device offers;
 *   'webgpu' takes WebGPU even on a software GPU (SwiftShader), where the page otherwise takes wasm.
 *   graphCapture false decodes every step plainly (the page's ?capture=0); warmShapes true warms every shape class
 *   even on a software GPU (the page's ?warm=shapes; runtime/asr.js warmUp), warmLong false all but the longest
 *   chunk's (?warm=decode: a bench of the decode alone). decodeForm 'captured' or 'plain': that
 *   decode form (the page's ?decode=; 'measure' measures both even on a software GPU); else knownDecode's, the choice this browser profile measured before
 *   (app/decode-choice.js), where made on the same GPU for the same model; else the warm-up measures both
 *   (runtime/decode-form.js). prefillRuns (the page's ?runs=): 'whole' a WebGPU prompt in one prefill run, 'chunked'
 *   in runs of the build's webgpu_prefill_chunk, either unchecked; else the warm-up's check of long runs decides (asr.js
 *   longRunsAgree). gpuValidation: onnxruntime-web's validationMode on WebGPU (the page's ?gpu_validation=;
 *   runtime/probe.js webgpuProvider). optimization: the sessions' graphOptimizationLevel (the page's ?opt=;
 *   runtime/site.js graphOptimization). weights: 'shared' runs the decoder's shared-weights forms on WebGPU (the page's
 *   ?weights=; runtime/site.js sharedForms).
 * @typedef {{type: 'transcribe', id: number, pcm: Float32Array, maxNewTokens?: number,
 *   chunkSeconds?: number, language?: string | null, context?: string}} TranscribeMessage
 *   pcm: 16 kHz mono (app/audio.js: the project's resampler), transferred; cut into chunks by runtime.json's
 *   `chunking` (runtime/chunk.js), chunkSeconds capping its length. Unset, maxNewTokens is runtime.json's.
 *   language: one of ReadyInfo's languages, forced on every chunk (asr.js transcribe); unset or null: automatic.
 *   context: text for every chunk's system message (asr.js contextPrefix: one over runtime.json's
 *   prompt.context.max_tokens fails the transcription); unset or '': none.
 * @typedef {{type: 'cancel', id: number}} CancelMessage
 *   Stop transcription `id` after the chunk's current step (the worker reads it at once, not after the transcription):
 *   its done message then has `cancelled` and the text so far.
 * @typedef {{type: 'clear-cache'}} ClearCacheMessage
 *   Delete the model's cached shards (Cache API).
 * @typedef {{type: 'set-lora', id: number, name: string | null}} SetLoraMessage
 *   Switch to the LoRA adapter `name` (ReadyInfo.loraAdapters; docs/adapters.md), or back to the base model
 *   (null). The worker handles messages one at a time, so a transcription under way finishes as it began
 *   and the next one runs with the choice.
 * @typedef {{type: 'live-start', id: number, rate: number, context?: string, language?: string | null}} LiveStartMessage
 *   Begin live transcription `id` of frames at `rate` Hz (runtime/live.js LiveSession: the project's resampler,
 *   runtime.json's `chunking_live`); answered by live-update messages as texts are made; context: as a
 *   TranscribeMessage's, for every chunk (a context too long fails the start).
 * @typedef {{type: 'live-audio', id: number, frames: Float32Array, capturedAt: number}} LiveAudioMessage
 *   The next block of mono frames (transferred); capturedAt: the wall time (performance.timeOrigin + now(), ms)
 *   its last frame was captured.
 * @typedef {{type: 'live-stop', id: number}} LiveStopMessage
 *   The audio has ended: its open chunk is the last; answered by live-done once every final text is made.
 * @typedef {LoadMessage | TranscribeMessage | CancelMessage | ClearCacheMessage | SetLoraMessage | LiveStartMessage
 *   | LiveAudioMessage | LiveStopMessage} ToWorkerMessage
 */
export const TO_WORKER = Object.freeze({
  load: 'load', transcribe: 'transcribe', cancel: 'cancel', clearCache: 'clear-cache', setLora: 'set-lora',
  liveStart: 'live-start', liveAudio: 'live-audio', liveStop: 'live-stop',
});

// ---------------------------------------------------------------- worker -> page

/**
 * @typedef {{type: 'progress', phase: 'manifest' | 'gpu' | 'download' | 'verify' | 'session' | 'warmup', loaded: number,
 *   total: number, file?: string, shard?: string, lora?: string, ep?: 'webgpu' | 'wasm'}} ProgressMessage
 *   manifest / gpu: the model's file list and settings being read, the GPU being asked (0 of 1, before the download);
 *   download / verify: bytes of the model's shards (loader.js), or with `lora` of that adapter's file;
 *   session / warmup: 0 of 1, no fraction; ep: the processor they prepare the model for (the page names the step by it).
 * @typedef {{type: 'warning', message: string, code?: string, shard?: string}} WarningMessage
 *   Loading goes on: a shard re-downloaded after a failed check ('corrupt'), no cache, a retry (code 'retry': stale
 *   once the load ends), storage full ('quota'); the GPU device lost ('device-lost': the model is being loaded again).
 *   message: the visitor's words; code (loader.js LoadWarning's) and shard (the shard's path in the manifest, where
 *   the warning concerns one) are for scripts: the page keeps them in window.webbuild.warningCodes, which webbuild
 *   verify reads (the corrupted shard's 'corrupt'), as the wording may change.
 * @typedef {{ep: 'webgpu' | 'wasm', variant: string, notice: string | null, gpu: string,
 *   shaderF16: boolean, threads: number, threadsWhy: string, kvCache: string, decode: string, sharedWeights: number, modelBytes: number,
 *   wasmHeapBytes: number, decodeChoice: import('./decode-form.js').DecodeChoice | null,
 *   prefillRuns: {limit: number, check: {tokens: number, limit: number, relative_diff: number, agree: boolean} | null},
 *   loraAdapters: string[], loraAbout: Record<string, string>, lora: string | null, languages: string[], language: string,
 *   context: string, takesContext: boolean,
 *   load: {download_ms: number, hash_ms: number, verified_ms: number, session_ms: number, warmup_ms: number,
 *     total_ms: number, encoder_warmup_ms: number, int8_ms: number, runs_check_ms: number, decode_form_ms: number,
 *     cache_ms: number, cache_bytes: number, network_bytes: number},
 *   loadTimeline: {step: string, start_ms: number, end_ms: number}[], loadOrigin: number}} ReadyInfo
 *   notice: why the model runs on wasm when the device was not asked to (null otherwise);
 *   threads: the wasm EP's (onnxruntime's numThreads once loaded), threadsWhy: site.js wasmThreads' why (the page adds
 *   whether and how it is cross-origin isolated: app/isolation.js);
 *   wasmHeapBytes: onnxruntime-web's wasm memory once loaded (runtime/heap.js; it only grows: a transcription's
 *   metrics give it again);
 *   kvCache: 'gpu-buffer' when the KV cache stays on the GPU, else 'cpu'; sharedWeights: the decoder's weights
 *   uploaded once for its sessions (the shared-weights forms, ?weights=shared; runtime/weights.js), 0 where each
 *   session holds its own;
 *   decode: 'captured' when decode steps replay a captured graph (runtime/capture.js), else 'plain (why)';
 *   decodeChoice: which decode form runs and why (runtime/decode-form.js: 'measured at load' with both forms' ms
 *   per token, 'asked for', or why not measured);
 *   prefillRuns: the prompt's tokens per prefill run (0: all in one run) and the warm-up's check of one long run
 *   against runs of the build's webgpu_prefill_chunk (null where it did not run: wasm, a software GPU's warm-up);
 *   gpu: the GPU WebGPU runs on (its description; 'none (...)' on wasm); loraAdapters: the LoRA adapters the
 *   page can switch on (none where the build ships none), loraAbout: what each is for (model.yaml's `description`,
 *   where it has one), lora: the one on (null: the base model); languages: the model's (runtime.json prompt.languages),
 *   language: the picker's default ('auto' or one of them: model.yaml's `language`); context: the context field's
 *   default (model.yaml's `context`), takesContext: whether the page can tokenise context text for this model
 *   (runtime.json prompt.context);
 *   load (ms, site.js loadSite): download_ms, verified_ms and total_ms from the start; hash_ms the sha256
 *   digests' time, summed; session_ms from the first session's start to the last one's end (sessions are made
 *   while later files still download); warmup_ms; encoder_warmup_ms the encoder's part of an every-shape warm-up,
 *   run between the encoder's session and the decoder's (within session_ms, while the decoder's files download);
 *   int8_ms: deriving an int8 wasm twin's uint8 weights from the int4 ones (runtime/int8.js; within session_ms, 0
 *   where no twin is int8); runs_check_ms and decode_form_ms, within warmup_ms: the check of one long prefill run
 *   against runs of the build's chunk, and the measurement of the decode forms (0 where they did not run);
 *   cache_bytes and network_bytes: the model's bytes read from the browser's cache and downloaded, cache_ms from the
 *   start to the last shard read from the cache (0: none was there); loadTimeline: the recogniser's steps in order
 *   (a graph's files awaited, its session, the warm-up's runs), ms from the load's start; loadOrigin: that start,
 *   performance.now() in the worker.
 * @typedef {{type: 'ready', info: ReadyInfo}} ReadyMessage
 * @typedef {{type: 'cached', kept: boolean}} CachedMessage
 *   After ready: the model's cache writes are over (they go on after the sessions are made; a page closed before
 *   this message leaves the next visit the rest to download); kept: the model is in the browser's cache (false: no
 *   cache, or its storage was full).
 * @typedef {{type: 'recovered', info: ReadyInfo}} RecoveredMessage
 *   The GPU device was lost (a warning 'device-lost' said so) and the model is loaded again (on the CPU): info is
 *   the new load's; a transcription under way goes on, from the chunk the loss interrupted.
 * @typedef {{type: 'chunk', id: number, index: number, count: number, start: number, end: number}} ChunkMessage
 *   Transcription `id` begins its chunk `index` (0-based) of `count`, [start, end) in 16 kHz samples.
 * @typedef {{type: 'token', id: number, token: number, text: string}} TokenMessage
 *   One generated token of transcription `id`; text: the transcript so far.
 * @typedef {{chunks: number, encoder_ms: number, ttft_ms: number, prompt_tokens: number, prefill_tokens_per_s: number,
 *   decode_tokens: number, decode_ms: number, decode_tokens_per_s: number | null, generated_tokens: number,
 *   total_ms: number, audio_ms: number, rtf: number, vad_ms: number | null, wasm_heap_bytes: number}} TranscriptionMetrics
 *   worker.js summarise(): one transcription's, over all its chunks; vad_ms: the speech detection's time (null: the
 *   site has none); wasm_heap_bytes: onnxruntime-web's wasm memory at its end (runtime/heap.js), the peak so far.
 * @typedef {{type: 'done', id: number, text: string, texts: string[], chunks: Array<[number, number]>, tokens: number[][],
 *   margins: number[][], metrics: TranscriptionMetrics, lora: string | null, cancelled: boolean, audioChunks: number,
 *   language: string | null}} DoneMessage
 *   texts, chunks, tokens: per chunk of the audio (runtime/chunk.js), chunks its [start, end) in 16 kHz samples (the
 *   page's subtitle cues); margins: per token, its logit minus the runner-up's (asr.js); metrics: worker.js
 *   summarise(); lora: the adapter it ran with (null: the base model); cancelled: stopped by a cancel message, the
 *   chunks so far (the last one perhaps cut short) of the audio's audioChunks; language: the one the first chunk
 *   naming one names (the forced one where forced), null where none does.
 * @typedef {{type: 'cache-cleared', existed: boolean}} CacheClearedMessage
 * @typedef {{type: 'lora-set', id: number, name: string | null}} LoraSetMessage
 *   The switch `id` is done: transcriptions from now on run with adapter `name` (null: the base model).
 * @typedef {{type: 'error', id?: number, message: string, detail?: string}} ErrorMessage
 *   id: the transcription or adapter switch that failed; without it, loading failed. message: for the visitor (a
 *   model file by its name and part, runtime/explain.js); detail: the error as thrown (shard names), for the console.
 * @typedef {{chunk: number, final: boolean, text: string, tokens: number[], margins: number[], start: number,
 *   end: number, audioAt: number, shownAt: number, computeMs: number, intervalMs: number, byPause?: boolean}} LiveUpdate
 *   A text of live chunk `chunk` (0, 1, ...): partial (its audio [start, end) so far, replaced by the chunk's next
 *   update) or final (the whole chunk, never changed). start, end: 16 kHz samples from the session's start;
 *   audioAt: when the audio it answers was captured (a partial: its last sample; a final: the audio that ended
 *   the chunk); shownAt: when the text was made; byPause: the final of a chunk a pause ended (not the stop).
 * @typedef {{n: number, mean: number, median: number, max: number} | null} Stats  ms; null: none measured
 * @typedef {{chunks: number, audio_ms: number, partials: number, interval_ms: number, pause_lag_ms: number,
 *   partial_lag_ms: Stats, pause_to_final_ms: Stats, word_delay_bound_ms: Stats, rtf: number}} LiveMetrics
 *   runtime/live.js summary(): partial_lag_ms: audio to partial text; pause_to_final_ms: from the audio that
 *   ended a chunk (pause_lag_ms after the speech ended: the policy's) to its final text; word_delay_bound_ms: per
 *   update, from the chunk's previous update's last sample (where a word missing from that one ended, at the
 *   earliest) to this one; rtf: time spent transcribing (partials and finals) over the audio's length.
 * @typedef {{type: 'live-update', id: number, update: LiveUpdate}} LiveUpdateMessage
 * @typedef {{type: 'live-done', id: number, text: string, tokens: number[][], margins: number[][],
 *   chunks: Array<[number, number]>, metrics: LiveMetrics}} LiveDoneMessage
 *   The session's final texts joined, its finals' tokens and margins and [start, end) per chunk.
 * @typedef {{type: 'alive'}} AliveMessage
 *   While the worker loads, every few seconds: its thread runs (the page's watch, app/watched-worker.js).
 * @typedef {ProgressMessage | WarningMessage | ReadyMessage | CachedMessage | RecoveredMessage | ChunkMessage | TokenMessage
 *   | DoneMessage | CacheClearedMessage | LoraSetMessage | ErrorMessage | LiveUpdateMessage | LiveDoneMessage
 *   | AliveMessage} FromWorkerMessage
 */
export const FROM_WORKER = Object.freeze({
  progress: 'progress', warning: 'warning', ready: 'ready', cached: 'cached', recovered: 'recovered', chunk: 'chunk',
  token: 'token', done: 'done',
  cacheCleared: 'cache-cleared', loraSet: 'lora-set', error: 'error', liveUpdate: 'live-update', liveDone: 'live-done',
  alive: 'alive',
});

// The id of the page's adapter picker, the <select> webbuild verify drives (webbuild/site/contract.py
// LORA_PICKER); its options' values are the adapters' names, and '' for the base model.
export const LORA_PICKER = 'lora';

// The page's live-transcription button (webbuild/site/contract.py LIVE_BUTTON), which webbuild verify presses,
// and the query parameter that makes the page keep the frames it captured (window.webbuild.live.audio(): the
// test and verify hand them to `webbuild transcribe --live`), KEEP_AUDIO.
export const LIVE_BUTTON = 'live';
export const KEEP_AUDIO = 'keep_audio';

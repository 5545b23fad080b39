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
 * @typedef {{type: 'load', manifestUrl: string, forceEp?: string | null, graphCapture?: boolean}} LoadMessage
 *   Load the model once (forceEp: the page's ?ep=). 'wasm' runs the CPU variant whatever the device offers;
 *   'webgpu' takes WebGPU even on a software GPU (SwiftShader), where the page otherwise takes wasm.
 *   graphCapture false decodes every step plainly (the page's ?capture=0).
 * @typedef {{type: 'transcribe', id: number, pcm: Float32Array, maxNewTokens?: number,
 *   chunkSeconds?: number}} TranscribeMessage
 *   pcm: 16 kHz mono (app/audio.js: the project's resampler), transferred; cut into chunks by runtime.json's
 *   `chunking` (runtime/chunk.js), chunkSeconds capping its length. Unset, maxNewTokens is runtime.json's.
 * @typedef {{type: 'clear-cache'}} ClearCacheMessage
 *   Delete the model's cached shards (Cache API).
 * @typedef {{type: 'set-lora', id: number, name: string | null}} SetLoraMessage
 *   Switch to the LoRA adapter `name` (ReadyInfo.loraAdapters; docs/adapters.md), or back to the base model
 *   (null). The worker handles messages one at a time, so a transcription under way finishes as it began
 *   and the next one runs with the choice.
 * @typedef {LoadMessage | TranscribeMessage | ClearCacheMessage | SetLoraMessage} ToWorkerMessage
 */
export const TO_WORKER = Object.freeze({
  load: 'load', transcribe: 'transcribe', clearCache: 'clear-cache', setLora: 'set-lora',
});

// ---------------------------------------------------------------- worker -> page

/**
 * @typedef {{type: 'progress', phase: 'download' | 'verify' | 'session' | 'warmup', loaded: number,
 *   total: number, file?: string, shard?: string, lora?: string}} ProgressMessage
 *   download / verify: bytes of the model's shards (loader.js), or with `lora` of that adapter's file;
 *   session / warmup: 0 of 1, no fraction.
 * @typedef {{type: 'warning', message: string}} WarningMessage
 *   Loading goes on: a shard re-downloaded after a failed check, no cache, a retry.
 * @typedef {{ep: 'webgpu' | 'wasm', variant: string, notice: string | null, gpu: string,
 *   shaderF16: boolean, threads: number, kvCache: string, decode: string, modelBytes: number,
 *   loraAdapters: string[], lora: string | null,
 *   load: {download_ms: number, session_ms: number, warmup_ms: number, total_ms: number}}} ReadyInfo
 *   notice: why the model runs on wasm when the device was not asked to (null otherwise);
 *   kvCache: 'gpu-buffer' when the KV cache stays on the GPU, else 'cpu';
 *   decode: 'captured' when decode steps replay a captured graph (runtime/capture.js), else 'plain (why)';
 *   gpu: the GPU WebGPU runs on (its description; 'none (...)' on wasm); loraAdapters: the LoRA adapters the
 *   page can switch on (none where the build ships none), lora: the one on (null: the base model).
 * @typedef {{type: 'ready', info: ReadyInfo}} ReadyMessage
 * @typedef {{type: 'token', id: number, token: number, text: string}} TokenMessage
 *   One generated token of transcription `id`; text: the transcript so far.
 * @typedef {{chunks: number, encoder_ms: number, ttft_ms: number, prompt_tokens: number, prefill_tokens_per_s: number,
 *   decode_tokens: number, decode_ms: number, decode_tokens_per_s: number | null, generated_tokens: number,
 *   total_ms: number, audio_ms: number, rtf: number}} TranscriptionMetrics
 *   worker.js summarise(): one transcription's, over all its chunks.
 * @typedef {{type: 'done', id: number, text: string, tokens: number[][], margins: number[][],
 *   metrics: TranscriptionMetrics, lora: string | null}} DoneMessage
 *   tokens: per chunk of the audio; margins: per token, its logit minus the runner-up's (asr.js); metrics: worker.js
 *   summarise(); lora: the adapter it ran with (null: the base model).
 * @typedef {{type: 'cache-cleared', existed: boolean}} CacheClearedMessage
 * @typedef {{type: 'lora-set', id: number, name: string | null}} LoraSetMessage
 *   The switch `id` is done: transcriptions from now on run with adapter `name` (null: the base model).
 * @typedef {{type: 'error', id?: number, message: string}} ErrorMessage
 *   id: the transcription or adapter switch that failed; without it, loading failed.
 * @typedef {ProgressMessage | WarningMessage | ReadyMessage | TokenMessage | DoneMessage | CacheClearedMessage
 *   | LoraSetMessage | ErrorMessage} FromWorkerMessage
 */
export const FROM_WORKER = Object.freeze({
  progress: 'progress', warning: 'warning', ready: 'ready', token: 'token', done: 'done',
  cacheCleared: 'cache-cleared', loraSet: 'lora-set', error: 'error',
});

// The id of the page's adapter picker, the <select> webbuild verify drives (webbuild/site/contract.py
// LORA_PICKER); its options' values are the adapters' names, and '' for the base model.
export const LORA_PICKER = 'lora';

// Formats the worker's numbers into the metrics panel.

import { isolation } from './isolation.js';

const $ = (/** @type {string} */ id) => /** @type {HTMLElement} */ (document.getElementById(id));
/**
 * worker.js summarise()'s per-transcription metrics, as far as the panel shows them.
 * @typedef {{encoder_ms: number, ttft_ms: number, prefill_tokens_per_s: number, decode_tokens_per_s: number | null,
 *   generated_tokens: number, rtf: number, chunks: number}} Metrics
 */

/** @param {number} v */
const ms = (v) => (v >= 1000 ? `${(v / 1000).toFixed(2)} s` : `${v.toFixed(0)} ms`);
/** @param {number | null} v */
const rate = (v) => (v == null ? 'n/a' : `${v.toFixed(1)} tok/s`);

/** @param {import('../runtime/contract.js').ReadyInfo} info */
export function renderInfo(info) {
  const l = info.load;
  // the processor the model runs on (a LoRA adapter is a model add-on: the picker's, not this)
  $('m-gpu').textContent = info.ep === 'webgpu' ? `the GPU: ${info.gpu}` : 'the CPU (no GPU used)';
  $('m-runtime').textContent = `${info.ep === 'webgpu' ? `WebGPU, ${decodeNote(info)}` : `WebAssembly, ${threadsNote(info)}`} · ${info.variant} · model ${mib(info.modelBytes)} MiB`
    + (info.ep === 'wasm' ? ` · wasm memory ${mib(info.wasmHeapBytes)} MiB` : '');
  // download and sessions overlap: each session is made once its files are in
  $('m-load').textContent = `${ms(l.total_ms)} (${fetched(l)}, sha256 ${ms(l.hash_ms ?? 0)}, ` +
    `sessions ${ms(l.session_ms)}${l.int8_ms ? ` (int8 weights ${ms(l.int8_ms)})` : ''}, warm-up ${ms(l.warmup_ms)})`;
}

// Where the model's bytes came from: the network, the browser's cache (read before any download), or both.
/** @param {import('../runtime/contract.js').ReadyInfo['load']} l */
function fetched(l) {
  if (!l.cache_bytes) return `download ${ms(l.download_ms)}`;
  const read = `${mib(l.cache_bytes)} MiB read in ${ms(l.cache_ms)}`;
  if (!l.network_bytes) return `from this browser's cache, ${read}`;
  return `from this browser's cache ${read}, then ${mib(l.network_bytes)} MiB downloaded in ${ms(l.download_ms - l.cache_ms)}`;
}
const mib = (/** @type {number} */ n) => (n / 2 ** 20).toFixed(1);

// Which decode form runs and why (runtime/decode-form.js): "captured steps (measured at load: captured 9.8,
// plain 25.4 ms per token)", "plain steps (asked for)".
/** @param {import('../runtime/contract.js').ReadyInfo} info */
function decodeNote(info) {
  const c = info.decodeChoice;
  if (!c) return info.decode;
  const times = c.captured_ms === undefined ? '' : `: captured ${c.captured_ms}, plain ${c.plain_ms} ms per token`;
  return `${c.form} steps (${c.why}${times})`;
}

// The wasm EP's threads and why that many: "2 threads (2 logical processors; cross-origin isolated: by the site's
// service worker)", "1 thread (not cross-origin isolated: the host sends no COOP/COEP headers and ...)".
/** @param {import('../runtime/contract.js').ReadyInfo} info */
function threadsNote(info) {
  const count = `${info.threads} thread${info.threads === 1 ? '' : 's'}`;
  // the worker sees only that it is not isolated; the page knows why (app/isolation.js)
  if (!isolation.isolated) return `${count} (${isolation.note || info.threadsWhy})`;
  return `${count} (${info.threadsWhy}; ${isolation.note})`;
}

/** @param {Metrics} m */
export function renderMetrics(m) {
  $('m-encoder').textContent = ms(m.encoder_ms);
  $('m-ttft').textContent = ms(m.ttft_ms);
  $('m-prefill').textContent = rate(m.prefill_tokens_per_s);
  $('m-decode').textContent = `${rate(m.decode_tokens_per_s)} (${m.generated_tokens} tokens)`;
  // processing time / audio length: below 1 keeps up with live audio; said as "N x faster" too
  const pace = m.rtf < 1 ? `${(1 / m.rtf).toFixed(1)}x faster than real time` : `${m.rtf.toFixed(1)}x slower than real time`;
  $('m-rtf').textContent = `${m.rtf.toFixed(3)} · ${pace}${m.chunks > 1 ? ` over ${m.chunks} chunks` : ''}`;
}

/** @param {{n: number, mean: number, max: number} | null} s */
const spread = (s) => (s ? `${ms(s.mean)} on average, ${ms(s.max)} at most` : 'n/a');

// The live mode's delays (runtime/live.js summary; contract.js LiveMetrics).
/** @param {import('../runtime/contract.js').LiveMetrics} m */
export function renderLiveMetrics(m) {
  document.querySelectorAll('#metrics .live-metric').forEach((row) => { /** @type {HTMLElement} */ (row).hidden = false; });
  $('m-live-partial').textContent = `${spread(m.partial_lag_ms)} behind the audio (${m.partials} updates)`;
  $('m-live-final').textContent = `${spread(m.pause_to_final_ms)} after a pause was heard (hearing it takes ${ms(m.pause_lag_ms)} of quiet)`;
  $('m-live-words').textContent = `${spread(m.word_delay_bound_ms)} after the word ended, at the latest`;
  $('m-rtf').textContent = `${m.rtf.toFixed(3)} · transcribing took ${(100 * m.rtf).toFixed(0)}% of the audio's length, over ${m.chunks} chunk${m.chunks === 1 ? '' : 's'}`;
}

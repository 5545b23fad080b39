// Module worker that owns the model: loads shards, picks EP + variant, creates the sessions,
// warms up, and transcribes. The page only talks to it by messages (see app.js).

import * as ort from './ort/ort.webgpu.min.mjs';
import { clearCache, loadFiles, loadManifest } from './runtime/loader.js';
import { chooseVariant, probeWebGPU, webgpuProvider } from './runtime/probe.js';
import { Recogniser } from './runtime/asr.js';
import { splitAtQuiet } from './runtime/chunk.js';

const ORT_WASM = 'ort-wasm-simd-threaded.asyncify.wasm';
let recogniser = null;
let runtime = null;
let modelId = null;

const post = (msg) => self.postMessage(msg);

self.onmessage = async ({ data }) => {
  try {
    if (data.type === 'load') await load(data);
    else if (data.type === 'transcribe') await transcribe(data);
    else if (data.type === 'clear-cache') post({ type: 'cache-cleared', existed: await clearCache(modelId) });
  } catch (e) {
    post({ type: 'error', id: data.id, message: e?.message ?? String(e) });
  }
};

async function load({ manifestUrl, forceEp }) {
  const t0 = performance.now();
  const manifest = await loadManifest(manifestUrl);
  modelId = manifest.model_id;
  const gpu = await probeWebGPU();
  const { ep, variant } = chooseVariant(manifest, gpu, forceEp);
  const notice = ep === 'wasm' && forceEp !== 'wasm'
    ? `WebGPU is not available (${gpu.reason}); running on the CPU with WebAssembly, which is slower.` : null;
  const roles = manifest.variants[variant];
  const reporting = {
    onProgress: (e) => post({ type: 'progress', ...e }),
    onWarning: (w) => post({ type: 'warning', message: w.message }),
  };
  const files = await loadFiles(manifest, [...roles.files, 'runtime.json', 'tokens.bin', ORT_WASM], reporting);
  const tDownload = performance.now();
  runtime = JSON.parse(new TextDecoder().decode(files.get('runtime.json')));
  configureOrt(files.get(ORT_WASM));
  post({ type: 'progress', phase: 'session', loaded: 0, total: 1 });
  // the variant the wasm EP runs (fp32 with its wasm twin), fetched only if WebGPU fails on another
  const wasmVariant = async () => {
    const v = chooseVariant(manifest, gpu, 'wasm').variant;
    const r = manifest.variants[v];
    return { variant: v, roles: r, files: v === variant ? files : await loadFiles(manifest, r.files, reporting) };
  };
  const made = await createRecogniser(files, roles, ep, gpu.adapter, wasmVariant);
  recogniser = made.recogniser;
  const used = made.variant ?? variant;
  const tSession = performance.now();
  post({ type: 'progress', phase: 'warmup', loaded: 0, total: 1 });
  await recogniser.warmUp();
  const tWarm = performance.now();
  post({
    type: 'ready',
    info: {
      ep: made.ep, variant: used, notice: made.notice ?? notice,
      adapter: made.ep === 'webgpu' ? gpu.description : 'none (WebAssembly on the CPU)',
      shaderF16: Boolean(gpu.shaderF16), threads: ort.env.wasm.numThreads, kvCache: recogniser.kvLocation,
      modelBytes: manifest.variants[used].files.reduce((n, f) => n + manifest.files[f].size, 0),
      load: { download_ms: tDownload - t0, session_ms: tSession - tDownload, warmup_ms: tWarm - tSession, total_ms: tWarm - t0 },
    },
  });
}

function configureOrt(wasmBinary) {
  ort.env.wasm.wasmBinary = wasmBinary; // from the verified shards: no second download
  // Threads need SharedArrayBuffer, which needs a cross-origin isolated page (COOP/COEP headers).
  ort.env.wasm.numThreads = self.crossOriginIsolated ? Math.min(4, navigator.hardwareConcurrency || 1) : 1;
  ort.env.logLevel = 'error';
}

// WebGPU first; a session that fails there (missing kernel, lost device) falls back to wasm
// with a notice instead of leaving the page dead. The fallback runs the wasm EP's own variant
// (wasmVariant: fp32 and its twin decoder; the fp16 graphs have int4 lookups wasm cannot run).
async function createRecogniser(files, roles, ep, adapter, wasmVariant) {
  try {
    const provider = ep === 'webgpu' ? await webgpuProvider(adapter) : ep;
    return { ep, recogniser: await Recogniser.create(ort, files, roles, runtime, provider) };
  } catch (e) {
    if (ep !== 'webgpu') throw e;
    const fallback = await wasmVariant();
    const recogniserWasm = await Recogniser.create(ort, fallback.files, fallback.roles, runtime, 'wasm');
    return { ep: 'wasm', variant: fallback.variant, recogniser: recogniserWasm,
      notice: `WebGPU session failed (${e.message}); running on WebAssembly instead.` };
  }
}

async function transcribe({ id, pcm, maxNewTokens, chunkSeconds }) {
  if (!recogniser) throw new Error('the model is not loaded yet');
  const chunks = splitAtQuiet(pcm, runtime.sample_rate, chunkSeconds ?? runtime.max_chunk_seconds);
  const texts = [];
  const results = [];
  for (const [start, end] of chunks) {
    const r = await recogniser.transcribe(pcm.subarray(start, end), {
      maxNewTokens: maxNewTokens ?? runtime.max_new_tokens,
      onToken: (text, token) => post({ type: 'token', id, token, text: [...texts, text].filter(Boolean).join(' ') }),
    });
    texts.push(r.text);
    results.push(r);
  }
  post({ type: 'done', id, text: texts.filter(Boolean).join(' '), tokens: results.map((r) => r.tokens), metrics: summarise(results) });
}

// Per-transcription metrics over all chunks: TTFT is the first chunk's; rates are totals.
function summarise(results) {
  const sum = (k) => results.reduce((n, r) => n + r.timings[k], 0);
  const t = results[0].timings;
  return {
    chunks: results.length,
    encoder_ms: sum('encoder_ms'),
    ttft_ms: t.ttft_ms,
    prompt_tokens: sum('prompt_tokens'),
    prefill_tokens_per_s: (sum('prompt_tokens') / sum('prefill_ms')) * 1000,
    decode_tokens_per_s: sum('decode_tokens') ? (sum('decode_tokens') / sum('decode_ms')) * 1000 : null,
    generated_tokens: results.reduce((n, r) => n + r.tokens.length, 0),
    total_ms: sum('total_ms'),
    audio_ms: sum('audio_ms'),
    rtf: sum('total_ms') / sum('audio_ms'),
  };
}

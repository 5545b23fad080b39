// Peer: a merged decoder graph (the onnxruntime-genai builder's model.onnx, or any optimum-style
// decoder with inputs_embeds, attention_mask, past_key_values.{i}.key|value -> logits,
// present.{i}.key|value), run with the same onnxruntime-web and EP as a built site. Speed only:
// synthetic embeddings for a prompt of --prompt-tokens (the Qwen3-ASR prompt of 2 s of audio is
// 9 + 26 + 6 = 41), then --decode-tokens steps, the KV cache kept on the GPU between steps.
// Graph I/O precision (float16 or float32) is read from the session.
//
//   node webbuild/tools/bench/merged.mjs DIR [--model model.onnx] [--ep auto|wasm|webgpu] [--decode-tokens 128]
//        [--prompt-tokens 41] [--ort DIR] [--session-config K=V]...
import { readFile } from 'node:fs/promises';
import path from 'node:path';

import { gpuCountedDecodes } from './counters.mjs';
import { gpuTimingPerToken } from './timing.mjs';
import { adapterName, disposeGpu, externalData, fileBytes, int64, openOrt, parseArgs } from './ort.mjs';
import { spread } from './stats.mjs';

const USAGE = 'merged.mjs DIR [--model model.onnx] [--ep wasm|webgpu] [--decode-tokens N] [--prompt-tokens N] [--ort DIR] [--session-config K=V]...';

/** @typedef {typeof import('onnxruntime-web')} Ort */
/** @typedef {import('onnxruntime-web').InferenceSession} InferenceSession */
/** @typedef {import('onnxruntime-web').InferenceSession.OnnxValueMapType} Outputs */

/**
 * @param {Ort} ort
 * @param {string} type the graph's float type: 'float32', else float16
 * @param {number} n
 * @param {number[]} dims
 * @param {number} seed
 */
function floats(ort, type, n, dims, seed) {
  // a fixed pseudo-random pattern in [-1, 1): decode speed does not depend on the values
  const x = Float32Array.from({ length: n }, (_, i) => (((i * 2654435761 + seed * 40503) >>> 0) % 2000) / 1000 - 1);
  if (type === 'float32') return new ort.Tensor('float32', x, dims);
  const h = new Uint16Array(n);
  const f = new Float32Array(1), u = new Uint32Array(f.buffer);
  for (let i = 0; i < n; i++) { // float32 -> float16, values in [-1, 1): no overflow, denormals flushed
    f[0] = x[i];
    const e = ((u[0] >>> 23) & 0xff) - 112;
    h[i] = ((u[0] >>> 16) & 0x8000) | (e > 0 ? (e << 10) | ((u[0] >>> 13) & 0x3ff) : 0);
  }
  return new ort.Tensor('float16', h, dims);
}

// Shapes the graph leaves symbolic (genai names the head size `kv_cache_dim`) come from its genai_config.json.
/**
 * @param {InferenceSession} session
 * @param {string} dir
 */
async function describe(session, dir) {
  const genai = JSON.parse(await readFile(path.join(dir, 'genai_config.json'), 'utf8').catch(() => '{}')).model?.decoder ?? {};
  // the decoder's inputs are tensors
  const meta = /** @type {Record<string, import('onnxruntime-web').InferenceSession.TensorValueMetadata>} */ (
    Object.fromEntries((session.inputMetadata ?? []).map((m) => [m.name, m])));
  const embeds = meta.inputs_embeds;
  if (!embeds) throw new Error(`${session.inputNames.join(', ')}: no inputs_embeds input (build the peer with exclude_embeds=true)`);
  const pasts = session.inputNames.filter((n) => n.startsWith('past_key_values.'));
  const kv = meta[pasts[0]].shape;
  /** @param {number | string | undefined} v a dimension: a number, or a symbol's name @param {number | undefined} fallback */
  const dim = (v, fallback) => (Number.isInteger(v) ? /** @type {number} */ (v) : fallback);
  // the dimensions are checked to be numbers just below
  const g = /** @type {{type: import('onnxruntime-web').Tensor.Type, hidden: number, pasts: string[], kvHeads: number, headDim: number}} */ (
    { type: embeds.type, hidden: dim(embeds.shape.at(-1), genai.hidden_size), pasts, kvHeads: dim(kv[1], genai.num_key_value_heads), headDim: dim(kv[3], genai.head_size) });
  if (![g.hidden, g.kvHeads, g.headDim].every(Number.isInteger)) throw new Error(`${dir}: graph shapes are symbolic and no genai_config.json gives them`);
  return g;
}

// preferredOutputLocation for present.{i}.key|value: the layer count from genai_config.json, else a
// generous bound (names a graph lacks are ignored).
/** @param {string} dir */
async function presentOnGpu(dir) {
  const genai = JSON.parse(await readFile(path.join(dir, 'genai_config.json'), 'utf8').catch(() => '{}'));
  const layers = genai.model?.decoder?.num_hidden_layers ?? 256;
  return Object.fromEntries(Array.from({ length: layers }, (_, i) => ['key', 'value'].map((k) => [`present.${i}.${k}`, 'gpu-buffer'])).flat());
}

/**
 * @param {Ort} ort
 * @param {InferenceSession} session
 * @param {Awaited<ReturnType<typeof describe>>} g
 * @param {{promptTokens: number, decodeTokens: number}} o
 */
async function run(ort, session, g, o) {
  /**
   * @param {import('onnxruntime-web').Tensor} embeds
   * @param {number} total
   * @param {Outputs} [past] the previous step's outputs
   */
  const feeds = (embeds, total, past) => ({
    inputs_embeds: embeds, attention_mask: int64(ort, new Array(total).fill(1), [1, total]),
    ...Object.fromEntries(g.pasts.map((n) => [n, past?.[n.replace('past_key_values', 'present')]
      ?? new ort.Tensor(g.type, g.type === 'float16' ? new Uint16Array(0) : new Float32Array(0), [1, g.kvHeads, 0, g.headDim])])),
  });
  const P = o.promptTokens;
  const t0 = performance.now();
  let out = await session.run(feeds(floats(ort, g.type, P * g.hidden, [1, P, g.hidden], 0), P));
  await out.logits.getData();
  const stamps = [performance.now()]; // a step ends when its logits are read (timing.mjs cuts steps here)
  for (let i = 0; i < o.decodeTokens; i++) {
    const prev = out;
    out = await session.run(feeds(floats(ort, g.type, g.hidden, [1, 1, g.hidden], i + 1), P + i + 1, prev));
    await out.logits.getData();
    disposeGpu(prev, Object.keys(prev)); // the inputs of this step, and its logits
    stamps.push(performance.now());
  }
  const kv = out[/** @type {string} */ (Object.keys(out).find((k) => k.startsWith('present.')))].location;
  disposeGpu(out, Object.keys(out));
  const steps = stamps.slice(1).map((t, i) => t - stamps[i]);
  return { prefill_ms: stamps[0] - t0, prompt_tokens: P, steps, stamps, kv };
}

async function main() {
  const o = parseArgs(process.argv.slice(2), { model: 'model.onnx', promptTokens: 41 }, USAGE);
  const { ort, adapter } = await openOrt(o);
  const t0 = performance.now();
  // the KV cache stays on the device between steps and the logits come back from run(), as the site's
  // runtime has them (the read-back inside run() is where timing.mjs cuts a step)
  const session = await ort.InferenceSession.create(await fileBytes(o.dir, o.model), {
    executionProviders: [o.ep], graphOptimizationLevel: 'all', logSeverityLevel: 3, extra: o.sessionConfig,
    externalData: await externalData(o.dir, [`${o.model}.data`]),
    ...(o.ep === 'webgpu' ? { preferredOutputLocation: await presentOnGpu(o.dir) } : {}),
  });
  const g = await describe(session, o.dir);
  const tSession = performance.now();
  await run(ort, session, g, { ...o, decodeTokens: 2 }); // warm-up: shader compilation
  const tWarm = performance.now();
  // a shorter decode first: WebGPU calls per token are the difference (counters.mjs); then the long
  // one's time per token cut into phases and a GPU-timed decode (timing.mjs; the inputs are synthetic,
  // so there are no token ids to compare)
  if (o.ep === 'webgpu') /** @type {import('./timing.mjs').GpuScope} */ (globalThis).__gpuTiming?.watchRun(session);
  /** @param {number} n */
  const decode = (n) => run(ort, session, g, { ...o, decodeTokens: n });
  const { result: r, counters_per_token } = await gpuCountedDecodes(decode, o.decodeTokens, o.ep === 'webgpu');
  const timing_per_token = await gpuTimingPerToken(decode, r);
  console.log(JSON.stringify({
    bench: 'merged-node', node: process.version, dir: o.dir, session_config: o.sessionConfig, ep: o.ep, variant: `merged ${g.type}`, threads: 1,
    kv_cache: r.kv, adapter: adapterName(o.ep, adapter),
    load: { session_ms: tSession - t0, warmup_ms: tWarm - tSession, total_ms: tWarm - t0 },
    summary: { encoder_ms: null, ttft_ms: r.prefill_ms, prefill_ms: r.prefill_ms, prompt_tokens: r.prompt_tokens, prefill_tokens_per_s: (r.prompt_tokens / r.prefill_ms) * 1000 },
    synthetic_decode: { prompt_tokens: r.prompt_tokens, prefill_ms: r.prefill_ms, tokens: r.steps.length, ms_per_token: spread(r.steps) },
    counters_per_token, timing_per_token,
  }));
}

main().then(() => process.exit(0), (e) => { console.error(e?.stack ?? String(e)); process.exit(1); });

// Baseline: the Qwen3-ASR split export as published (encoder.onnx, decoder_init.onnx,
// decoder_step.onnx, embed_tokens.bin, config.json), run with the same onnxruntime-web and EP
// as a built site, driven directly (the site runtime takes only built graphs). Speed only:
// the inputs are synthetic with the site's shapes (a zero mel of --audio-seconds, the
// Qwen3-ASR prompt length: 9 prefix + audio + 6 suffix tokens), then --decode-tokens greedy steps.
//
//   node webbuild/tools/bench/split.mjs MODEL_DIR [--ep auto|wasm|webgpu] [--decode-tokens 128] [--audio-seconds 2]
//        [--kv gpu|cpu] [--ort DIR] [--session-config K=V]...   (DIR: onnxruntime-web's dist/, default webbuild/site/onnxruntime-web)
import { readFile } from 'node:fs/promises';
import path from 'node:path';

import { gpuCountedDecodes } from './counters.mjs';
import { adapterName, argmaxLast, disposeGpu, externalData, fileBytes, int64, openOrt, parseArgs } from './ort.mjs';
import { spread } from './stats.mjs';

const USAGE = 'split.mjs MODEL_DIR [--ep wasm|webgpu] [--decode-tokens N] [--audio-seconds S] [--kv gpu|cpu] [--ort DIR] [--session-config K=V]...';

// Sessions for the three graphs. Decoders share one external data file as published
// (decoder_weights.data), or have one each (<graph>.data, as int4 re-exports do).
/** @typedef {typeof import('onnxruntime-web')} Ort */
/** @typedef {import('onnxruntime-web').InferenceSession} InferenceSession */
/** @typedef {import('onnxruntime-web').InferenceSession.SessionOptions} SessionOptions */
/**
 * The export's config.json, as far as it is read here.
 * @typedef {{decoder: {hidden_size: number, vocab_size: number}, special_tokens: {pad_token_id: number, audio_pad_token_id: number},
 *   embed_tokens_dtype: string}} SplitConfig
 */

/**
 * @param {Ort} ort
 * @param {string} dir
 * @param {string} ep
 * @param {boolean} kvOnGpu
 * @param {Record<string, string>} extra session config entries
 */
async function sessions(ort, dir, ep, kvOnGpu, extra) {
  /** @type {SessionOptions} */
  const opts = { executionProviders: [ep], graphOptimizationLevel: 'all', logSeverityLevel: 3, extra };
  /** @type {SessionOptions} */
  const kv = kvOnGpu ? { preferredOutputLocation: { present_keys: 'gpu-buffer', present_values: 'gpu-buffer' } } : {};
  /** @param {string} name */
  const decoder = async (name) => ort.InferenceSession.create(await fileBytes(dir, name),
    { ...opts, ...kv, externalData: await externalData(dir, ['decoder_weights.data', `${name}.data`]) });
  return {
    encoder: await ort.InferenceSession.create(await fileBytes(dir, 'encoder.onnx'), { ...opts, externalData: await externalData(dir, ['encoder.onnx.data']) }),
    init: await decoder('decoder_init.onnx'),
    step: await decoder('decoder_step.onnx'),
  };
}

// One synthetic transcription: encoder, prefill, then `n` decode steps timed one by one.
/**
 * @param {Ort} ort
 * @param {Awaited<ReturnType<typeof sessions>>} s
 * @param {SplitConfig} cfg
 * @param {Float32Array} embed the embedding table [V, H]
 * @param {{audioSeconds: number, decodeTokens: number}} o
 */
async function run(ort, s, cfg, embed, o) {
  const { hidden_size: H, vocab_size: V } = cfg.decoder;
  const sp = cfg.special_tokens;
  const frames = Math.round(o.audioSeconds * 100);
  const t0 = performance.now();
  const enc = await s.encoder.run({ mel: new ort.Tensor('float32', new Float32Array(128 * frames), [1, 128, frames]) });
  const tEnc = performance.now();
  const A = enc.audio_features.dims[1];
  const ids = [...new Array(9).fill(sp.pad_token_id), ...new Array(A).fill(sp.audio_pad_token_id), ...new Array(6).fill(sp.pad_token_id)];
  let out = await s.init.run({
    input_ids: int64(ort, ids, [1, ids.length]), position_ids: int64(ort, ids.map((_, i) => i), [1, ids.length]),
    audio_features: enc.audio_features, audio_offset: int64(ort, [9], [1]),
  });
  let token = argmaxLast(out.logits, V);
  const tFirst = performance.now();
  /** @type {number[]} */
  const steps = [];
  for (let i = 0; i < o.decodeTokens; i++) {
    const t = performance.now();
    const prev = out;
    out = await s.step.run({
      input_embeds: new ort.Tensor('float32', embed.slice(token * H, (token + 1) * H), [1, 1, H]),
      position_ids: int64(ort, [ids.length + i], [1, 1]),
      past_keys: prev.present_keys, past_values: prev.present_values,
    });
    disposeGpu(prev, ['present_keys', 'present_values']);
    token = argmaxLast(out.logits, V);
    steps.push(performance.now() - t);
  }
  disposeGpu(out, ['present_keys', 'present_values']);
  return { encoder_ms: tEnc - t0, prefill_ms: tFirst - tEnc, prompt_tokens: ids.length, ttft_ms: tFirst - t0, steps, kv: out.present_keys.location };
}

// embed_tokens.bin is raw [V, H]; fp16 tables are widened once here.
/**
 * @param {Uint8Array} bytes
 * @param {string} dtype
 */
function embedTable(bytes, dtype) {
  if (dtype !== 'float16') return new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
  const h = new Uint16Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 2);
  const f = new Float32Array(h.length);
  const dv = new DataView(new ArrayBuffer(4));
  for (let i = 0; i < h.length; i++) {
    const x = h[i], e = (x >> 10) & 0x1f, m = x & 0x3ff;
    dv.setUint32(0, ((x & 0x8000) << 16) | (e === 0 ? 0 : e === 31 ? 0x7f800000 | (m << 13) : ((e + 112) << 23) | (m << 13)));
    f[i] = e === 0 ? (x & 0x8000 ? -1 : 1) * m * 2 ** -24 : dv.getFloat32(0);
  }
  return f;
}

async function main() {
  const o = parseArgs(process.argv.slice(2), { audioSeconds: 2, kv: 'gpu' }, USAGE);
  const { ort, adapter } = await openOrt(o);
  /** @type {SplitConfig} */
  const cfg = JSON.parse(await readFile(path.join(o.dir, 'config.json'), 'utf8'));
  const t0 = performance.now();
  const s = await sessions(ort, o.dir, o.ep, o.ep === 'webgpu' && o.kv === 'gpu', o.sessionConfig);
  const embed = embedTable(await fileBytes(o.dir, 'embed_tokens.bin'), cfg.embed_tokens_dtype);
  const tSession = performance.now();
  await run(ort, s, cfg, embed, { ...o, decodeTokens: 2 }); // warm-up: shader compilation
  const tWarm = performance.now();
  // a shorter decode first: WebGPU calls per token are the difference (counters.mjs)
  const { result: r, counters_per_token } = await gpuCountedDecodes((/** @type {number} */ n) => run(ort, s, cfg, embed, { ...o, decodeTokens: n }), o.decodeTokens, o.ep === 'webgpu');
  console.log(JSON.stringify({
    bench: 'split-baseline-node', node: process.version, dir: o.dir, session_config: o.sessionConfig, ep: o.ep, variant: `split ${cfg.embed_tokens_dtype}`, threads: 1,
    kv_cache: r.kv, adapter: adapterName(o.ep, adapter),
    load: { session_ms: tSession - t0, warmup_ms: tWarm - tSession, total_ms: tWarm - t0 },
    summary: { encoder_ms: r.encoder_ms, ttft_ms: r.ttft_ms, prefill_ms: r.prefill_ms, prompt_tokens: r.prompt_tokens, prefill_tokens_per_s: (r.prompt_tokens / r.prefill_ms) * 1000 },
    synthetic_decode: { prompt_tokens: r.prompt_tokens, prefill_ms: r.prefill_ms, tokens: r.steps.length, ms_per_token: spread(r.steps) },
    counters_per_token,
  }));
}

main().then(() => process.exit(0), (e) => { console.error(e?.stack ?? String(e)); process.exit(1); });

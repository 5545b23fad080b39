// The speech recogniser on onnxruntime-web: encoder (PCM in, mel inside the graph), prompt with
// the audio features spliced over the <|audio_pad|> positions, prefill, then greedy decoding
// with the KV cache kept on the GPU. pipeline/transcribe.py's greedy loop is the spec.

import { StreamingDecoder, TokenTable, answerText } from './tokens.js';

export class Recogniser {
  // files: Map of logical name -> bytes (from the loader); roles: the manifest variant entry.
  static async create(ort, files, roles, runtime, ep) {
    const r = new Recogniser(ort, runtime, ep);
    const opts = r.sessionOptions();
    r.encoder = await ort.InferenceSession.create(files.get(roles.encoder), { ...opts, executionProviders: [ep] });
    r.decoder = await ort.InferenceSession.create(files.get(roles.decoder), {
      ...opts,
      executionProviders: [ep],
      externalData: [{ path: roles.decoder_data, data: files.get(roles.decoder_data) }],
      // present.* stay on the GPU and come back as the next step's past: no round trip per token
      ...(ep === 'webgpu' && { preferredOutputLocation: Object.fromEntries(r.presentNames().map((n) => [n, 'gpu-buffer'])) }),
    });
    const embed = files.get(roles.embed);
    r.embed = new Float32Array(embed.buffer, embed.byteOffset, embed.byteLength / 4);
    r.tokens = new TokenTable(files.get('tokens.bin'));
    return r;
  }

  constructor(ort, runtime, ep) {
    this.ort = ort;
    this.rt = runtime;
    this.ep = ep;
    this.d = runtime.decoder;
  }

  sessionOptions() {
    return { graphOptimizationLevel: 'all', logSeverityLevel: 3 };
  }

  presentNames() {
    return Array.from({ length: this.d.num_layers }, (_, i) => [`present.${i}.key`, `present.${i}.value`]).flat();
  }

  // Compiles the shaders for both graphs on a second of silence and two decode steps, so the
  // visitor's first transcription does not pay for it.
  async warmUp() {
    await this.transcribe(new Float32Array(this.rt.sample_rate), { maxNewTokens: 2, forceSteps: true });
  }

  async encode(pcm) {
    const out = await this.encoder.run({ pcm: new this.ort.Tensor('float32', pcm, [1, pcm.length]) });
    const feats = out.audio_features;
    return { data: feats.data, tokens: feats.dims[1] };
  }

  // Greedy transcription of one chunk. onToken(text so far, token id) streams the transcript.
  async transcribe(pcm, { maxNewTokens = this.rt.max_new_tokens, onToken = () => {}, forceSteps = false } = {}) {
    const H = this.d.hidden_size;
    const t0 = performance.now();
    const audio = await this.encode(pcm);
    const tEnc = performance.now();
    const { prefix, suffix, audio_pad } = this.rt.prompt;
    const ids = [...prefix, ...new Array(audio.tokens).fill(audio_pad), ...suffix];
    const x = this.embedRows(ids);
    x.set(audio.data.subarray(0, audio.tokens * H), prefix.length * H); // splice the audio features
    let past = this.emptyPast();
    let { logits, present } = await this.step(x, ids.length, ids.length, past);
    const tPrefill = performance.now();
    const eos = new Set(this.rt.eos_token_ids);
    const text = new StreamingDecoder(this.tokens);
    const generated = [];
    let tFirst = null;
    try {
      for (let i = 0; i < maxNewTokens; i++) {
        const token = argmaxLast(logits, this.d.vocab_size);
        if (eos.has(token) && !forceSteps) break;
        generated.push(token);
        tFirst ??= performance.now();
        onToken(answerText(text.push(token), this.rt.answer), token);
        if (i + 1 === maxNewTokens) break; // the loop would not use the next logits
        past = present;
        ({ logits, present } = await this.step(this.embedRows([token]), 1, ids.length + generated.length, past));
        dispose(past);
      }
    } finally {
      dispose(present);
    }
    const tEnd = performance.now();
    return {
      text: answerText(text.finish(), this.rt.answer, true),
      tokens: generated,
      timings: { encoder_ms: tEnc - t0, prefill_ms: tPrefill - tEnc, prompt_tokens: ids.length,
        ttft_ms: (tFirst ?? tEnd) - t0, decode_ms: tEnd - (tFirst ?? tEnd), decode_tokens: Math.max(0, generated.length - 1),
        total_ms: tEnd - t0, audio_ms: (pcm.length / this.rt.sample_rate) * 1000 },
    };
  }

  // One decoder run over `s` new embeddings with `total` = past + s positions.
  async step(x, s, total, past) {
    const { Tensor } = this.ort;
    const feeds = {
      inputs_embeds: new Tensor('float32', x, [1, s, this.d.hidden_size]),
      attention_mask: new Tensor('int64', new BigInt64Array(total).fill(1n), [1, total]),
      ...past,
    };
    const out = await this.decoder.run(feeds);
    const present = {};
    for (let i = 0; i < this.d.num_layers; i++) {
      present[`past_key_values.${i}.key`] = out[`present.${i}.key`];
      present[`past_key_values.${i}.value`] = out[`present.${i}.value`];
    }
    return { logits: out.logits, present };
  }

  emptyPast() {
    const { Tensor } = this.ort;
    const dims = [1, this.d.num_key_value_heads, 0, this.d.head_dim];
    const past = {};
    for (let i = 0; i < this.d.num_layers; i++) {
      past[`past_key_values.${i}.key`] = new Tensor('float32', new Float32Array(0), dims);
      past[`past_key_values.${i}.value`] = new Tensor('float32', new Float32Array(0), dims);
    }
    return past;
  }

  embedRows(ids) {
    const H = this.d.hidden_size;
    const x = new Float32Array(ids.length * H);
    ids.forEach((id, i) => x.set(this.embed.subarray(id * H, (id + 1) * H), i * H));
    return x;
  }
}

// Greedy choice over the last position (a pruned graph has only that one); the first maximum
// wins ties, as numpy's argmax does.
function argmaxLast(logits, vocab) {
  const data = logits.data;
  const base = data.length - vocab;
  let best = 0;
  for (let i = 1; i < vocab; i++) if (data[base + i] > data[base + best]) best = i;
  return best;
}

// GPU tensors hold GPU memory until disposed; CPU tensors are left to the collector.
function dispose(tensors) {
  for (const t of Object.values(tensors ?? {})) if (t?.location === 'gpu-buffer') t.dispose();
}

// The speech recogniser on onnxruntime-web: encoder (PCM in, mel inside the graph), prompt with
// the audio features spliced over the <|audio_pad|> positions, prefill, then greedy decoding
// with the KV cache kept on the GPU. webbuild/reference/transcribe.py's greedy loop is the spec.
//
// Every graph input and output is named as runtime.json's `io` says (webbuild/site/contract.py IO).
// Two decoder interfaces (the variant's files say which graph; the graph says which inputs):
// - inputs_embeds: rows looked up here in embed_tokens.bin, audio features spliced in here;
// - input_ids + audio_features + audio_offset (quantized builds): the graph does the int4 lookup
//   and the splice, and no float table is shipped. Decode steps pass an empty audio_features.
//
// A build with LoRA adapters (docs/adapters.md) also has the adapted decoder: its sessions decode while
// an adapter is on (setLora), the base ones otherwise; the adapter's values reach them as extra inputs.

import { CapturedSteps } from './capture.js';
import { kvNames } from './contract.js';
import { fixedChoice, measureForms } from './decode-form.js';
import { lastRow, pickLast, toFloat32 } from './greedy.js';
import { int8WeightsInWorkers, int8Workers, keptRanges, readInt8Plan } from './int8.js';
import { detachBuffer } from './loader.js';
import { LoraInputs } from './lora-inputs.js';
import { BpeEncoder, checkContextLength } from './bpe.js';
import { StreamingDecoder, TokenTable, answerLanguage, answerText } from './tokens.js';
import { uploadWeights, weightFeeds } from './weights.js';

/** @typedef {import('webbuild-types').OrtTensor} OrtTensor */
/** @typedef {import('webbuild-types').Runtime} Runtime */
/** @typedef {NonNullable<import('webbuild-types').OrtSessionOptions['graphOptimizationLevel']>} GraphOptimization */
/** @typedef {Map<string, Uint8Array>} Files  logical file name -> bytes (loader.js loadFiles) */
/** @typedef {string | {name: string, device?: GPUDevice}} Provider  'webgpu' | 'wasm', or probe.js webgpuProvider's entry */
/**
 * One graph's file names by kind (runtime.json roles): the graph, its external data, its wasm twin (int8: the
 * int8 twin's plan, int8.js), and for the decoder the embedding table and the step form (the adapted
 * decoder's: and its delta graph; shared, step_shared: the shared-weights forms of the graph and the step form).
 * weights: where the graph runs in its shared-weights form (site.js), the weights it takes as inputs, from `data`.
 * @typedef {{graph: string, data?: string, wasm?: string, int8?: string, embed?: string, step?: string, delta?: string,
 *   shared?: string, step_shared?: string, weights?: Record<string, import('./weights.js').WeightEntry>}} GraphFiles
 */
/**
 * A variant's graphs as the recogniser takes them (site.js variantGraphs).
 * @typedef {{dtype?: 'float16' | 'float32', encoder: GraphFiles, decoder: GraphFiles, decoder_lora?: GraphFiles,
 *   lora?: Record<string, number[]> | null, loraLayout?: import('./lora-encode.js').LoraLayout}} Graphs
 */
/** @typedef {Record<string, OrtTensor>} Feeds  tensors by input or output name */
/** @typedef {(choice: import('./greedy.js').Pick) => boolean} Emit  takes a chosen token; whether to go on */
/**
 * transcribe()'s result; timings in ms; language: the one the answer names (the forced one where forced), null where
 * it names none.
 * @typedef {{text: string, language: string | null, tokens: number[], margins: number[], timings: {encoder_ms: number, prefill_ms: number,
 *   prompt_tokens: number, ttft_ms: number, decode_ms: number, decode_tokens: number, total_ms: number, audio_ms: number}}} Transcript
 */
/**
 * A decoder session and, on WebGPU, its captured steps; lora: the adapted graph's extra inputs; weights: the shared
 * weights its session takes as inputs (none where it holds its own).
 * @typedef {{decoder: import('webbuild-types').OrtSession, steps: CapturedSteps | null, decodeMode: string,
 *   lora: LoraInputs | null, weights: Feeds}} DecoderSet
 */

export class Recogniser {
  // files: Map of logical name -> bytes (from the loader); graphs: the variant's file names by graph,
  // {encoder: {graph, data, wasm}, decoder: {graph, data, wasm, embed}, dtype} (site.js variantGraphs).
  // graphs.decoder_lora and graphs.lora (lora.js loraShapes): the adapted decoder of a build with adapters.
  /**
   * @param {import('webbuild-types').Ort} ort
   * @param {Files} files
   * @param {Graphs} graphs
   * @param {Runtime} runtime
   * @param {Provider} ep
   * @param {(names: string[]) => Promise<unknown>} [ready] resolves once those files' bytes are all in `files`
   *   (loader.js startLoad): each session is made as soon as its own are, while the others download
   * @param {{warmShapes?: boolean, warmLong?: boolean, release?: (name: string) => void,
   *   optimization?: GraphOptimization}} [opts] warmShapes: warmUp
   *   will warm every shape class (site.js), so the encoder's part of it runs here, while the decoder's files still
   *   download; warmLong false: not the longest chunk's (site.js SiteOptions);
   *   release: a file no later session reads (loader.js Load.release), on wasm, where nothing falls back to them;
   *   optimization: the sessions' graphOptimizationLevel (default 'all')
   */
  static async create(ort, files, graphs, runtime, ep, ready = async () => {}, { warmShapes = false, warmLong = true,
    release, optimization } = {}) {
    const r = new Recogniser(ort, runtime, ep);
    r.warmLong = warmLong;
    if (optimization) r.optimization = optimization;
    /** @param {GraphFiles} g */
    const used = (g) => [r.graphFile(g), g.data, g.embed, r.ep === 'webgpu' && g.step, r.ep === 'webgpu' && g.delta,
      r.ep === 'wasm' && g.wasm && g.int8]
      .filter((n) => typeof n === 'string');
    // on wasm, each session's files go once it is made: the next session's weights are copied into the heap
    // beside them otherwise (the tab's peak), and the collector may not have freed them yet
    /** @type {Set<string>} */
    let kept = new Set();
    // the files graph g reads that no later graph does: releasable as soon as g's session no longer needs them
    const upNext = (/** @type {GraphFiles} */ g, /** @type {(GraphFiles | undefined)[]} */ later) => {
      kept = new Set([runtime.files.tokens, g.embed ?? '', ...later.flatMap((l) => (l ? used(l) : []))]);
      r.release = r.ep === 'wasm' && release ? (name) => { if (!kept.has(name)) release(name); } : null;
    };
    const done = (/** @type {GraphFiles} */ g) => used(g).forEach((name) => r.release?.(name));
    const adapted = graphs.lora && graphs.decoder_lora?.graph ? graphs.decoder_lora : undefined;
    upNext(graphs.encoder, [graphs.decoder, adapted]);
    await r.timed('encoder files', () => ready(used(graphs.encoder)));
    await r.timed('encoder session', () => r.loadEncoder(files, graphs.encoder));
    done(graphs.encoder);
    // one call into onnxruntime-web at a time (its asyncify build suspends one call stack), so the decoder's
    // session waits for this: the files it needs are rarely all there before the encoder's warm-up ends
    if (warmShapes && r.ep === 'webgpu') await r.timed('encoder warm-up', () => r.warmEncoder());
    upNext(graphs.decoder, [adapted]);
    await r.timed('decoder files', () => ready(used(graphs.decoder)));
    await r.loadDecoder(files, graphs.decoder, graphs.dtype);
    done(graphs.decoder);
    if (adapted && graphs.lora) {
      upNext(adapted, []);
      await r.timed('adapted files', () => ready(used(adapted)));
      await r.loadAdapted(files, adapted, graphs.lora, graphs.loraLayout);
      done(adapted);
    }
    r.release = null;
    await ready([runtime.files.tokens]);
    r.tokens = await r.timed('token table', async () => new TokenTable(/** @type {Uint8Array} */ (files.get(runtime.files.tokens))));
    return r;
  }

  // `run()`'s result, its start and end kept in the load's timeline under `step`.
  /**
   * @template T
   * @param {string} step
   * @param {() => Promise<T>} run
   * @returns {Promise<T>}
   */
  async timed(step, run) {
    const start = performance.now();
    try {
      return await run();
    } finally {
      this.timeline.push({ step, start, end: performance.now() });
    }
  }

  // The encoder session as the site runs it (tests/test_encoder_webgpu.py drives it alone).
  /** @param {Files} files @param {GraphFiles} encoder */
  async loadEncoder(files, encoder) {
    this.encoder = await this.session(files, encoder);
  }

  // A session of the graph this EP runs (graphFile) with its external data (external), and `extra` options.
  /**
   * @param {Files} files
   * @param {GraphFiles} names
   * @param {object} [extra]
   */
  async session(files, names, extra = {}) {
    // a shared-weights graph's weights come as inputs (this.weights), not with the session
    const { list, derived } = names.weights ? { list: [], derived: [] } : await this.external(files, names);
    try {
      return await this.ort.InferenceSession.create(/** @type {Uint8Array} */ (files.get(this.graphFile(names))), {
        ...this.sessionOptions(), executionProviders: [this.provider], externalData: list.length ? list : undefined, ...extra,
      });
    } finally {
      derived.forEach(detachBuffer); // the session holds its copy: freed now, not at the collector's next run
    }
  }

  // The decoder session as the site runs it (tests/test_decoder_webgpu.py drives it alone); dtype: of
  // past/present and audio_features.
  /**
   * @param {Files} files
   * @param {GraphFiles} decoder
   * @param {'float16' | 'float32'} [dtype]
   */
  async loadDecoder(files, decoder, dtype = 'float32') {
    this.dtype = dtype;
    const device = decoder.weights && await this.gpuDevice();
    if (decoder.weights && device) {
      const file = /** @type {Uint8Array} */ (files.get(/** @type {string} */ (decoder.data)));
      this.weights = await this.timed('decoder weights', async () => uploadWeights(this.ort, device,
        file, /** @type {Record<string, import('./weights.js').WeightEntry>} */ (decoder.weights)));
    }
    /** @type {DecoderSet} */
    this.base = this.active = await this.decoderSet(files, decoder);
    this.takesIds = this.decoder.inputNames.includes(this.io.input_ids);
    if (!this.takesIds) {
      const embed = /** @type {Uint8Array} */ (files.get(/** @type {string} */ (decoder.embed))); // such a variant has one
      this.embed = new Float32Array(embed.buffer, embed.byteOffset, embed.byteLength / 4);
    }
  }

  // The adapted decoder (docs/adapters.md), loaded beside the base one: its lora.* inputs made once
  // (lora-inputs.js LoraInputs: zeros, the base model, until an adapter is written into them). The base
  // sessions decode while no adapter is on, so a build's adapters cost the base decode nothing.
  /**
   * @param {Files} files
   * @param {GraphFiles} decoder
   * @param {Record<string, number[]>} shapes lora.js loraShapes
   * @param {import('./lora-encode.js').LoraLayout} [layout] the manifest variant's lora_layout: the step form's inputs
   */
  async loadAdapted(files, decoder, shapes, layout = {}) {
    // a provider given by name has no device
    const device = await this.gpuDevice();
    this.loraLayout = layout;
    // the delta graph makes the step's merged updates at a switch (lora-inputs.js computeDeltas), on the sessions' GPU;
    // without it the adapted step cannot be fed, and the adapted decode runs plain steps (decodeMode says why)
    const delta = device && decoder.delta ? await this.ort.InferenceSession.create(
      /** @type {Uint8Array} */ (files.get(decoder.delta)), { ...this.sessionOptions(), executionProviders: [this.provider] })
      .catch((e) => { console.warn(`the adapter's delta graph: ${e?.message ?? e}`); return null; }) : null;
    // the joined groups' base rows are copied from the weights file when the step's inputs are made (loadSteps)
    const lora = new LoraInputs(this.ort, shapes, this.dtype, device, { layout, file: (name) => files.get(name), delta });
    this.adapted = await this.decoderSet(files, decoder, lora);
    await lora.computeDeltas(); // on the zeros: its shaders compiled now, not at the first switch
  }

  // A decoder session and, on WebGPU, its captured steps; lora: the adapted graph's extra inputs.
  /**
   * @param {Files} files
   * @param {GraphFiles} decoder
   * @param {LoraInputs | null} [lora]
   * @returns {Promise<DecoderSet>}
   */
  async decoderSet(files, decoder, lora = null) {
    // present.* stay on the GPU and come back as the next step's past: no round trip per token
    const which = lora ? 'adapted' : 'decoder';
    const session = await this.timed(`${which} session`, () => this.session(files, decoder,
      this.ep === 'webgpu' ? { preferredOutputLocation: Object.fromEntries(this.presentNames().map((n) => [n, 'gpu-buffer'])) } : {}));
    /** @type {DecoderSet} */
    const set = { decoder: session, steps: null, decodeMode: 'plain', lora,
      weights: decoder.weights ? weightFeeds(this.weights, session.inputNames) : {} };
    await this.timed(`${which} step session`, () => this.loadSteps(set, files, decoder));
    return set;
  }

  // The sessions decoding now: the base ones, or the adapted ones with an adapter on (setLora).
  // (this.active: set by loadDecoder, which create() runs)
  get decoder() { return /** @type {DecoderSet} */ (this.active).decoder; }
  get steps() { return /** @type {DecoderSet} */ (this.active).steps; }
  // 'captured', or 'plain (why)': where capture works but plain steps were chosen, the choice's reason
  get decodeMode() {
    const mode = /** @type {DecoderSet} */ (this.active).decodeMode, c = this.decodeChoice;
    if (mode !== 'captured' || this.capturedForm() || !c) return mode;
    return `plain (${c.why}${c.plain_ms === undefined ? '' : `: ${c.plain_ms} against ${c.captured_ms} ms per token captured`})`;
  }

  // An adapter's values (lora.js loraValues in this.dtype) into the adapted sessions' inputs, which then
  // decode; null: the base sessions again. rows: lora.js loraRows, where the values may be non-zero.
  // Takes effect at the next transcription.
  /**
   * @param {import('./lora.js').LoraValues | null} values
   * @param {Record<string, number[]>} [rows]
   */
  async setLora(values, rows) {
    if (!values) {
      this.active = this.base;
      return;
    }
    if (!this.adapted) throw new Error('this build has no adapted decoder: it ships no adapters');
    await /** @type {LoraInputs} */ (this.adapted.lora).set(values, rows);
    this.active = this.adapted;
  }

  // On WebGPU, the decoder's step form replayed by graph capture (runtime/capture.js) decodes after the
  // plain prefill; where it cannot be set up, every step runs plainly (decodeMode says which, and why).
  // The adapted steps share the base steps' static buffers (only one set decodes at a time) and bind
  // the adapter inputs once, as capture wants.
  /**
   * @param {DecoderSet} set
   * @param {Files} files
   * @param {GraphFiles} decoder
   */
  async loadSteps(set, files, decoder) {
    if (this.ep !== 'webgpu' || !decoder.step || !this.rt.max_positions) return;
    try {
      set.steps = await CapturedSteps.create(this.ort, this.provider, /** @type {Uint8Array} */ (files.get(decoder.step)),
        decoder.weights ? undefined : external(files, decoder.data), this.d, this.io, this.rt.max_positions, this.dtype,
        { shared: this.base?.steps, options: this.sessionOptions(),
          extraFeeds: (names) => ({ ...weightFeeds(decoder.weights ? this.weights : {}, names), ...set.lora?.stepFeedsFor(names) }) });
      set.decodeMode = 'captured';
    } catch (e) {
      plainSteps(set, e);
    }
  }

  // Which graph file of `names` ({graph, wasm, ...}) this EP runs. Quantized builds carry wasm twins
  // (webbuild/forms/wasm_twin.py): the same weights with the int4 ops the wasm build lacks
  // (GatherBlockQuantized) or runs slowly (MatMulNBits) in standard ops.
  /** @param {GraphFiles} names */
  graphFile(names) {
    return (this.ep === 'wasm' && names.wasm) || names.graph;
  }

  // The external data of the graph this EP runs (list): its weights file and, for an int8 twin on wasm, the
  // uint8 weights derived from it now (int8.js: in workers on a page with cores to spare), which are `derived`
  // too: this thread's own, freed once the session holds them.
  /**
   * @param {Files} files
   * @param {GraphFiles} names
   * @returns {Promise<{list: {path: string, data: Uint8Array}[], derived: Uint8Array[]}>}
   */
  async external(files, names) {
    const list = names.data ? [{ path: names.data, data: /** @type {Uint8Array} */ (files.get(names.data)) }] : [];
    if (this.ep !== 'wasm' || !names.wasm || !names.int8) return { list, derived: [] };
    const plan = readInt8Plan(/** @type {Uint8Array} */ (files.get(names.int8)));
    const source = /** @type {Uint8Array} */ (files.get(plan.source));
    const { bytes, ms } = await int8WeightsInWorkers(plan, source, int8Workers());
    this.int8Ms += ms;
    const derived = [bytes];
    // where no later session reads the source file, only what the twin reads of it stays (the int4 weights just
    // turned into uint8 ones are most of it): the file goes before the session copies its weights in
    const entry = list.find((e) => e.path === plan.source);
    if (entry && plan.keep && this.release) {
      entry.data = keptRanges(source, plan.keep);
      derived.push(entry.data);
      this.release(plan.source);
    }
    return { list: [...list, { path: plan.file, data: bytes }], derived };
  }

  // ep: 'webgpu' | 'wasm', or a provider entry such as {name: 'webgpu', device} (probe.js webgpuProvider)
  /**
   * @param {import('webbuild-types').Ort} ort
   * @param {Runtime} runtime
   * @param {Provider} ep
   */
  constructor(ort, runtime, ep) {
    this.ort = ort;
    this.rt = runtime;
    this.provider = ep;
    this.ep = typeof ep === 'string' ? ep : ep.name;
    this.d = runtime.decoder;
    this.io = runtime.io; // the graphs' input and output names
    // WebGPU prefill runs of at most this many tokens, 0 for the whole prompt in one run: the build's
    // webgpu_prefill_chunk until warmUp finds this adapter's long runs right (longRunsAgree)
    this.prefillRunLimit = this.ep === 'webgpu' ? runtime.webgpu_prefill_chunk : 0;
    /** @type {{tokens: number, limit: number, relative_diff: number, agree: boolean} | null} */
    this.longRunsCheck = null; // what longRunsAgree measured
    /** @type {'whole' | 'chunked' | null} the page's ?runs=: the prompt's runs taken as asked, unchecked; null: checked */
    this.runsRequest = null;
    /** @type {GraphOptimization} onnxruntime's graph optimizations at each session's making (the page's ?opt=) */
    this.optimization = 'all';
    this.kv = kvNames(this.io, this.d?.num_layers ?? 0); // {past, present} per layer, key then value
    /** @type {DecoderSet | null} */
    this.adapted = null; // the adapted decoder's set, in a build with adapters (loadAdapted)
    /** @type {import('./lora-encode.js').LoraLayout} the adapted step's inputs (switchLora makes their values by it) */
    this.loraLayout = {};
    /** @type {'float16' | 'float32'} */
    this.dtype = 'float32';
    /** @type {TokenTable | null} */
    this.tokens = null; // the decode table (create)
    /** @type {BpeEncoder | null} */
    this.bpe = null; // the context text's encoder, made on the first context (contextPrefix)
    /** @type {Float32Array} */
    this.embed = new Float32Array(0); // the embedding table, for decoders that take inputs_embeds
    this.takesIds = false;
    this.kvLocation = 'cpu';
    /** @type {{short: OrtTensor, long: OrtTensor | null} | null} */
    this.warmAudio = null; // warmEncoder's outputs until warmUp takes them
    this.encoderWarmMs = 0; // warmEncoder's time
    this.warmLong = true; // warmEncoder encodes the longest chunk too (create: false for a bench of the decode alone)
    this.int8Ms = 0; // deriving int8 twins' weights at load (int8.js)
    /** @type {Feeds} the decoder's weights, uploaded once for its shared-weights forms (weights.js); empty otherwise */
    this.weights = {};
    /** @type {{step: string, start: number, end: number}[]} the load's steps in this class, performance.now() stamps */
    this.timeline = [];
    /** @type {((name: string) => void) | null} while create() makes a session on wasm: lets a file go that no later
     * session reads (create's `release`); null otherwise */
    this.release = null;
    /** @type {import('./decode-form.js').DecodeRequest} which decode form to run (site.js): 'auto' measures both */
    this.formRequest = { form: 'auto', why: null, measure: true, gpu: '', model: '' };
    /** @type {import('./decode-form.js').DecodeChoice | null} the form the base decode runs and why (chooseDecodeForm) */
    this.decodeChoice = null;
  }

  // The GPU device the sessions run on (null on wasm): its own where probe.js made one, else onnxruntime-web's.
  /** @returns {Promise<GPUDevice | null>} */
  async gpuDevice() {
    if (this.ep !== 'webgpu') return null;
    return /** @type {{device?: GPUDevice}} */ (this.provider).device ?? await this.ort.env.webgpu.device;
  }

  /** @returns {import('webbuild-types').OrtSessionOptions} */
  sessionOptions() {
    return { graphOptimizationLevel: this.optimization, logSeverityLevel: 3 };
  }

  presentNames() {
    return this.kv.map((n) => n.present);
  }

  // Compiles the shaders for both graphs on two seconds of audio and two decode steps, so the visitor's first
  // transcription does not pay for it; on WebGPU the adapted graphs too, on their zero inputs, which also
  // records their captured step: switching an adapter on then compiles nothing.
  // On WebGPU also the other classes of shapes a chunk can meet: onnxruntime-web compiles a kernel's pipeline
  // the first time it meets one, which cost a first clip of a new length up to 1.3 s on an H200 (BENCHMARKS.md,
  // tools/bench/first_use.py counts them). The classes found: the encoder's lead (a clip that starts loud:
  // its Concat), the encoder's attention and convolutions past their size thresholds, the front-end's
  // convolutions over a whole number of 64-frame tiles (WARM_FRAMES), a prompt of several prefill runs (the
  // later ones with a past: the short clip's second, the long prompt's last two on a past of zeros), a
  // one-token run after a long prompt (a decode without capture), and a last prefill run of 2 or 3 tokens
  // (QUERY_TILE_RUNS: the decode attention tiles a run of under 32 queries by 1, 2 or 4, and the tile of 2 was
  // compiled by the first 1 s and 8 s clips on the H200, prompts of 31 + 2 and 4 x 31 + 3 tokens). Where the
  // adapter's long runs agree (longRunsAgree, first) a prompt is one run: the long one warms the longest, and
  // SHORT_PROMPT_RUNS the tiles of a prompt under 32 tokens. wasm compiles nothing per shape (measured: the same
  // time on the first and the second clip of a length).
  /** @param {{shapes?: boolean}} [opts] shapes false: a second of silence only (site.js: a software GPU) */
  async warmUp({ shapes = true } = {}) {
    const rate = this.rt.sample_rate;
    const every = this.ep === 'webgpu' && shapes;
    // WebGPU: two prefill runs where the build chunks the prompt (one with a past); wasm: a second of silence,
    // as ever (one prefill run, no shapes to warm)
    const short = every ? loudStart(2 * rate) : new Float32Array(rate);
    if (every && !this.warmAudio) await this.warmEncoder();
    const { short: shortAudio, long } = (every && this.warmAudio) || { short: undefined, long: null };
    this.warmAudio = null;
    if (this.prefillRunLimit && this.runsRequest === 'whole') this.prefillRunLimit = 0;
    if (every && this.prefillRunLimit && !this.runsRequest) {
      if (await this.longRunsAgree()) this.prefillRunLimit = 0;
    }
    const active = this.active;
    // the adapted graphs on WebGPU always, shapes or not: their captured step must be recorded here, on zero
    // adapter inputs (recorded on the first adapted clip instead, the SwiftShader run gave other tokens)
    for (const set of this.ep === 'webgpu' && this.adapted ? [this.base, this.adapted] : [this.base]) {
      this.active = set;
      const which = set === this.base ? 'decoder' : 'adapted';
      try {
        await this.timed(`${which} warm-up`, () => this.transcribe(short, { maxNewTokens: 2, forceSteps: true, audio: shortAudio }));
        if (long) {
          await this.timed(`${which} long prompt`, () => this.transcribe(short,
            { maxNewTokens: 2, forceSteps: true, captured: false, audio: long, tail: true }));
        }
        if (every) {
          await this.timed(`${which} prompt runs`,
            () => this.warmRuns(this.prefillRunLimit ? QUERY_TILE_RUNS : SHORT_PROMPT_RUNS, this.prefillRunLimit));
        }
      } finally {
        this.active = active;
      }
    }
    await this.timed(DECODE_FORMS, () => this.chooseDecodeForm());
  }

  // warmUp's check of one long prefill run against chunked runs (longRunsAgree, its parts), ms; 0 where it did not run
  get runsCheckMs() { return this.stepMs(RUNS_CHECK); }
  // warmUp's measurement of the decode forms (chooseDecodeForm), ms
  get formMs() { return this.stepMs(DECODE_FORMS); }

  // The timeline's steps do not overlap, so a step of several parts ('long-run check: one run', ...) is their sum.
  /** @param {string} step a name `timed` recorded, or the name before its parts' colon @returns {number} ms */
  stepMs(step) {
    const of = (/** @type {string} */ name) => name === step || name.startsWith(`${step}: `);
    return this.timeline.reduce((ms, t) => ms + (of(t.step) ? t.end - t.start : 0), 0);
  }

  // The decode form of the base sessions (decode-form.js): the one asked for, else on a GPU whose step graph was
  // captured both measured here, on a second of silence decoded past its end token; the adapted sessions follow it.
  async chooseDecodeForm() {
    const capturable = Boolean(this.base?.steps);
    const { form, why, measure, gpu, model } = this.formRequest;
    if (form !== 'auto' || !capturable || !measure) {
      const because = !capturable ? this.base?.decodeMode ?? 'no step form'
        : form === 'auto' ? 'not measured on a software GPU' : why ?? 'asked for';
      this.decodeChoice = { ...fixedChoice(form, capturable, because), gpu, model };
      return;
    }
    const active = this.active;
    this.active = this.base;
    try {
      const silence = new Float32Array(this.rt.sample_rate);
      const audio = await this.encode(silence);
      this.decodeChoice = await measureForms(async (form, tokens) => {
        const stamps = /** @type {number[]} */ ([]);
        await this.transcribe(silence, { maxNewTokens: tokens + 1, forceSteps: true, captured: form === 'captured', audio,
          onToken: () => stamps.push(performance.now()) });
        return stamps.slice(1).map((t, i) => t - stamps[i]);
      });
      Object.assign(this.decodeChoice, { gpu, model });
    } finally {
      this.active = active;
    }
  }

  // Whether decodes may run the captured steps: the chosen form's; before a choice is made (the warm-up and the
  // measurement, whose decodes say `captured` themselves) yes.
  capturedForm() {
    return (this.decodeChoice?.form ?? 'captured') === 'captured';
  }

  // The encoder's part of warmUp's every-shape warm-up: a 2-s clip that starts loud and the longest chunk rounded
  // down to WARM_FRAMES, kept for warmUp's prompts (Recogniser.create runs it before the decoder's session).
  async warmEncoder() {
    const t0 = performance.now();
    const rate = this.rt.sample_rate;
    const frames = Math.floor((this.rt.max_chunk_seconds * rate) / HOP / WARM_FRAMES) * WARM_FRAMES;
    const short = await this.encode(loudStart(2 * rate));
    this.warmAudio = { short, long: frames && this.warmLong ? await this.encode(new Float32Array(frames * HOP)) : null };
    this.encoderWarmMs += performance.now() - t0;
  }

  // One prefill run of each length in `lengths` after a past of `past` positions: the kernels a prompt's last run
  // of that length takes (warmUp). The tokens are the prompt's first, repeated: only the shapes count.
  /** @param {number[]} lengths @param {number} past */
  async warmRuns(lengths, past) {
    for (const length of lengths) {
      const zeros = this.emptyPast(past);
      const out = await this.step(this.inputs(new Array(length).fill(this.rt.prompt.prefix[0] ?? 0)), past + length, zeros);
      dispose(zeros);
      dispose(out.present);
    }
  }

  // Whether one prefill run of more than prefillRunLimit tokens gives what runs of prefillRunLimit give, on this
  // adapter: onnxruntime-web 1.30's GroupQueryAttention takes another kernel for 32 queries or more, once found
  // wrong on SwiftShader (webbuild/pipeline/assemble.py), right there and on the H200's NVIDIA driver since
  // (BENCHMARKS.md), and it may differ by vendor and features. Compared:
  // the last position's logits and the last layer's values at every position, for a prompt of varied tokens
  // twice the limit and more. Right, the whole prompt goes in one run: a 30 s clip's prefill in 1 run, not 14.
  async longRunsAgree() {
    const limit = this.prefillRunLimit, V = this.d.vocab_size;
    const ids = Array.from({ length: 2 * limit + 2 }, (_, i) => (i * 7919 + 11) % V);
    // each part a step of the load's timeline (where a slow check's time goes; runsCheckMs sums them)
    const runs = await this.timed(`${RUNS_CHECK}: runs of ${limit}`, () => this.prefill(ids, null, 0, false, limit));
    const whole = await this.timed(`${RUNS_CHECK}: one run`, () => this.prefill(ids, null, 0, false, ids.length));
    try {
      const value = this.kv[this.kv.length - 1].past; // the last layer's value, by the next run's name
      const [a, b] = await this.timed(`${RUNS_CHECK}: read-back`,
        () => Promise.all([runs.present[value], whole.present[value]].map((t) => t.getData())));
      const diff = Math.max(relativeDiff(lastRow(runs.logits, V), lastRow(whole.logits, V)),
        relativeDiff(toFloat32(/** @type {Float32Array} */ (a)), toFloat32(/** @type {Float32Array} */ (b))));
      this.longRunsCheck = { tokens: ids.length, limit, relative_diff: diff, agree: diff <= AGREE[this.dtype] };
      return this.longRunsCheck.agree;
    } finally {
      dispose(runs.present);
      dispose(whole.present);
    }
  }

  /** @param {Float32Array} pcm */
  async encode(pcm) {
    // this.encoder: set by loadEncoder
    const out = await /** @type {import('webbuild-types').OrtSession} */ (this.encoder).run({ [this.io.pcm]: new this.ort.Tensor('float32', pcm, [1, pcm.length]) });
    return out[this.io.audio_features];
  }

  // Greedy transcription of one chunk. onToken(text so far, token id) streams the transcript.
  /**
   * @param {Float32Array} pcm
   * @param {{maxNewTokens?: number, onToken?: (text: string, token: number) => void, forceSteps?: boolean,
   *   captured?: boolean, audio?: OrtTensor, tail?: boolean, stop?: () => boolean, language?: string | null,
   *   context?: string}} [options]
 *   language: one of runtime.json's prompt.languages, forced: its answer prefix after the prompt (null: the model
 *   names the language it hears); context: text in the system message (contextPrefix; '': none); stop: asked after
   *   each token, true ends the decode there (a live partial no longer wanted); captured: false decodes plainly; audio: the
   *   encoder's output for pcm, already there; tail: only the prompt's last two prefill runs, on a past of zeros
   *   (warmUp: the shapes of a long prompt's prefill at the cost of two runs)
   * @returns {Promise<Transcript>}
   */
  async transcribe(pcm, { maxNewTokens = this.rt.max_new_tokens, onToken = () => {}, forceSteps = false, captured = true, audio, tail = false, stop = () => false, language = null, context = '' } = {}) {
    const t0 = performance.now();
    const prefix = this.contextPrefix(context); // a context too long fails before the encoder runs
    audio ??= await this.encode(pcm);
    const tEnc = performance.now();
    const { suffix, audio_pad } = this.rt.prompt;
    const forced = this.forcedPrefix(language);
    const ids = [...prefix, ...new Array(audio.dims[1]).fill(audio_pad), ...suffix, ...forced];
    const { logits, present } = await this.prefill(ids, audio, prefix.length, tail);
    const tPrefill = performance.now();
    const eos = new Set(this.rt.eos_token_ids);
    const text = new StreamingDecoder(/** @type {TokenTable} */ (this.tokens)); // set by create()
    for (const id of forced) text.push(id); // the answer read as if the model had said its prefix
    const generated = /** @type {number[]} */ ([]), margins = /** @type {number[]} */ ([]);
    /** @type {number | null} */
    let tFirst = null;
    // each chosen token: kept and streamed, unless it ends the answer; whether to go on
    /** @type {Emit} */
    const emit = ({ token, margin }) => {
      if (eos.has(token) && !forceSteps) return false;
      generated.push(token);
      margins.push(margin);
      tFirst ??= performance.now();
      onToken(answerText(text.push(token), this.rt.answer), token);
      return generated.length < maxNewTokens && !stop();
    };
    const kv = { present };
    try {
      await this.decode(pickLast(logits, this.d.vocab_size), kv, ids.length, maxNewTokens, emit, captured);
    } finally {
      dispose(kv.present);
    }
    const tEnd = performance.now();
    const answer = text.finish();
    return {
      text: answerText(answer, this.rt.answer, true),
      language: answerLanguage(answer, this.rt.answer), // the forced one where forced
      tokens: generated,
      margins, // per token: its logit minus the runner-up's (how close greedy decoding was to another token)
      timings: { encoder_ms: tEnc - t0, prefill_ms: tPrefill - tEnc, prompt_tokens: ids.length,
        ttft_ms: (tFirst ?? tEnd) - t0, decode_ms: tEnd - (tFirst ?? tEnd), decode_tokens: Math.max(0, generated.length - 1),
        total_ms: tEnd - t0, audio_ms: (pcm.length / this.rt.sample_rate) * 1000 },
    };
  }

  // The prompt's ids before the audio with `context` in the system message, tokenised here (runtime/bpe.js: the
  // encoder is made on the first context); a context over runtime.json's prompt.context.max_tokens fails.
  /** @param {string} context @returns {number[]} */
  contextPrefix(context) {
    const { prefix, context: form } = this.rt.prompt;
    if (!context) return prefix;
    if (!form) throw new Error('this model takes no context text (its tokenizer is not one the page can encode with)');
    this.bpe ??= new BpeEncoder(/** @type {TokenTable} */ (this.tokens), form);
    const ids = this.bpe.prefix(context, prefix);
    checkContextLength(ids.length - prefix.length, form.max_tokens);
    return ids;
  }

  // The ids of `language`'s forced answer prefix (runtime.json prompt.languages, tokenised by the build); none for null.
  /** @param {string | null} language @returns {number[]} */
  forcedPrefix(language) {
    if (language == null) return [];
    const ids = this.rt.prompt.languages?.[language];
    if (!ids) throw new Error(`the model has no language “${language}” (it has ${Object.keys(this.rt.prompt.languages ?? {}).join(', ') || 'none'})`);
    return ids;
  }

  // Greedy decoding after the prefill, from its choice `first`; kv.present: the prefill's cache, then
  // the latest plain step's (the caller disposes it).
  /**
   * @param {import('./greedy.js').Pick} first
   * @param {{present: Feeds}} kv
   * @param {number} promptLength
   * @param {number} maxNewTokens
   * @param {Emit} emit
   * @param {boolean} [captured] false: plain steps even where the captured ones fit
   */
  async decode(first, kv, promptLength, maxNewTokens, emit, captured = true) {
    if (!emit(first)) return;
    const steps = captured && this.capturedForm() && this.steps?.fits(promptLength, maxNewTokens) ? this.steps : null;
    if (steps && await this.decodeCaptured(steps, kv.present, promptLength, first.token, maxNewTokens, emit)) return;
    let next = first;
    for (let total = promptLength + 1; ; total++) {
      const past = kv.present;
      const out = await this.step(this.inputs([next.token]), total, past);
      kv.present = out.present;
      dispose(past);
      next = pickLast(out.logits, this.d.vocab_size);
      if (!emit(next)) return;
    }
  }

  // The captured steps (runtime/capture.js), steps.inFlight of them queued ahead of the token being read:
  // the GPU feeds each step's choice to the next, so the CPU only reads the tokens as they come. The
  // steps queued past an end token are wasted work, never output. False when the step graph could not
  // be recorded: the caller then decodes plainly from the prefill's cache.
  /**
   * @param {CapturedSteps} steps
   * @param {Feeds} present the prefill's KV cache
   * @param {number} promptLength
   * @param {number} token the prefill's choice
   * @param {number} maxNewTokens
   * @param {Emit} emit
   */
  async decodeCaptured(steps, present, promptLength, token, maxNewTokens, emit) {
    steps.begin(present, promptLength, token);
    /** @type {Promise<import('./greedy.js').Pick>[]} */
    const queue = [];
    let total = promptLength;
    try {
      for (;;) {
        while (queue.length < steps.inFlight && total - promptLength < maxNewTokens - 1) queue.push((await steps.issue(++total)).pick);
        if (!queue.length || !emit(await /** @type {Promise<import('./greedy.js').Pick>} */ (queue.shift()))) return true;
      }
    } catch (e) {
      if (steps.recorded) throw e;
      plainSteps(/** @type {DecoderSet} */ (this.active), e);
      return false;
    } finally {
      await Promise.allSettled(queue); // read-backs still mapping: their buffers are reused next time
    }
  }

  // The prompt in one run, or in runs of at most `limit` tokens (prefillRunLimit: on WebGPU the build's
  // webgpu_prefill_chunk, where onnxruntime-web's GroupQueryAttention may be wrong for longer runs, until
  // longRunsAgree finds this adapter's right).
  /**
   * @param {number[]} ids the prompt
   * @param {OrtTensor | null} audio the encoder's output
   * @param {number} offset the audio's first position in ids
   * @param {boolean} [tail] only the last two runs, after a past of zeros (warmUp)
   * @param {number} [limit] tokens per run, 0 for all
   */
  async prefill(ids, audio, offset, tail = false, limit = this.prefillRunLimit) {
    const n = limit || ids.length;
    const from = tail ? Math.max(0, (Math.ceil(ids.length / n) - 2) * n) : 0;
    /** @type {Feeds} */
    let past = this.emptyPast(from);
    let out = null;
    for (let at = from; at < ids.length; at += n) {
      const part = ids.slice(at, at + n);
      out = await this.step(this.inputs(part, audio, offset - at), at + part.length, past);
      dispose(past);
      past = out.present;
    }
    if (!out) throw new Error('an empty prompt');
    return out;
  }

  // Decoder inputs for new token `ids`; the rows of `audio` (encoder output) go over the
  // positions from `offset` on (relative to ids[0]; negative when the audio began earlier).
  /**
   * @param {number[]} ids
   * @param {OrtTensor | null} [audio]
   * @param {number} [offset]
   */
  inputs(ids, audio = null, offset = 0) {
    const { Tensor } = this.ort;
    const H = this.d.hidden_size;
    const A = audio ? audio.dims[1] : 0;
    const r0 = Math.max(0, -offset), r1 = Math.min(A, ids.length - offset); // rows in this run
    const spliced = audio && r1 > r0 ? audio : null; // the audio, where this run has rows of it
    /** @type {Float32Array | Uint16Array} */
    const data = spliced ? /** @type {Float32Array | Uint16Array} */ (spliced.data) : new Float32Array(0);
    if (this.takesIds) {
      const whole = r0 === 0 && r1 === A;
      const rows = spliced ? (whole ? spliced : new Tensor(spliced.type, data.slice(r0 * H, r1 * H), [1, r1 - r0, H])) : null;
      return {
        [this.io.input_ids]: new Tensor('int64', BigInt64Array.from(ids, BigInt), [1, ids.length]),
        [this.io.audio_features]: rows ?? new Tensor(this.dtype, this.dtype === 'float16' ? new Uint16Array(0) : new Float32Array(0), [1, 0, H]),
        [this.io.audio_offset]: new Tensor('int64', BigInt64Array.from([BigInt(rows ? offset + r0 : 0)]), [1]),
      };
    }
    const x = this.embedRows(ids);
    if (spliced) x.set(toFloat32(data.subarray(r0 * H, r1 * H)), (offset + r0) * H); // the audio splice
    return { [this.io.inputs_embeds]: new Tensor('float32', x, [1, ids.length, H]) };
  }

  // One decoder run with `total` = past + new positions.
  /**
   * @param {Feeds} inputs
   * @param {number} total
   * @param {Feeds} past
   * @returns {Promise<{logits: OrtTensor, present: Feeds}>}
   */
  async step(inputs, total, past) {
    const { Tensor } = this.ort;
    const feeds = {
      ...inputs,
      [this.io.attention_mask]: new Tensor('int64', new BigInt64Array(total).fill(1n), [1, total]),
      ...past,
      .../** @type {DecoderSet} */ (this.active).lora?.feeds, // the adapted graph's lora.* inputs
      .../** @type {DecoderSet} */ (this.active).weights, // a shared-weights graph's weights
    };
    const out = await this.decoder.run(feeds);
    this.kvLocation = out[this.kv[0].present].location; // 'gpu-buffer' when the cache stays on the GPU
    // the next run's past, by its input names
    const present = Object.fromEntries(this.kv.map((n) => [n.past, out[n.present]]));
    return { logits: out[this.io.logits], present };
  }

  // The past before the prompt: none, or `positions` of zeros (warmUp)
  emptyPast(positions = 0) {
    const { Tensor } = this.ort;
    const dims = [1, this.d.num_key_value_heads, positions, this.d.head_dim];
    const size = positions * this.d.num_key_value_heads * this.d.head_dim;
    const empty = () => new Tensor(this.dtype, this.dtype === 'float16' ? new Uint16Array(size) : new Float32Array(size), dims);
    return Object.fromEntries(this.kv.map((n) => [n.past, empty()]));
  }

  /** @param {number[]} ids */
  embedRows(ids) {
    const H = this.d.hidden_size;
    const x = new Float32Array(ids.length * H);
    ids.forEach((id, i) => x.set(this.embed.subarray(id * H, (id + 1) * H), i * H));
    return x;
  }
}

const HOP = 160; // PCM samples per mel frame (webbuild/reference/mel.py)
// prefill runs warmed for the decode attention's query tiles of 2 (warmUp); 1 and 4 are the decode's and a full run's
const QUERY_TILE_RUNS = [2, 3];
// the same tiles where the whole prompt is one run: a prompt under 32 tokens (a clip under a second) takes them
// without a past
const SHORT_PROMPT_RUNS = [2, 3, 8];
// the load timeline's names of warmUp's two measured steps (runsCheckMs, formMs)
const RUNS_CHECK = 'long-run check';
const DECODE_FORMS = 'decode forms';

// the largest difference, relative to the largest value, that longRunsAgree takes for the same computation in
// runs of another length: right runs measured 6.3e-7 (float32, SwiftShader), the wrong ones of assemble.py were
// off by 0.1 in the logits; float16's bound is a margin over its rounding, not yet measured on a GPU with it
const AGREE = { float32: 1e-4, float16: 5e-3 };
const WARM_FRAMES = 128; // the long warm-up's frames are a multiple of this: the front-end's tiled convolutions' other class

// `samples` of a clip that starts loud (a 440 Hz tone for a tenth of a second, then silence): the encoder puts
// its whole lead before such a clip (webbuild/reference/mel.py lead_length).
/** @param {number} samples */
function loudStart(samples) {
  const pcm = new Float32Array(samples);
  for (let i = 0; i < Math.min(samples, 1600); i++) pcm[i] = 0.1 * Math.sin((2 * Math.PI * 440 * i) / 16000);
  return pcm;
}

// External weights as onnxruntime-web wants them: the path as written inside the graph.
/**
 * @param {Files} files
 * @param {string} [name]
 * @returns {{path: string, data: Uint8Array}[] | undefined}
 */
function external(files, name) {
  return name ? [{ path: name, data: /** @type {Uint8Array} */ (files.get(name)) }] : undefined;
}

// A set whose step graph could not be captured decodes every step plainly (decodeMode says why).
/**
 * @param {DecoderSet} set
 * @param {any} why a caught error: anything may have been thrown
 */
function plainSteps(set, why) {
  set.steps = null;
  set.decodeMode = `plain (graph capture unavailable: ${why?.message ?? why})`;
}

// The largest difference between a and b relative to a's largest magnitude; Infinity where either has a NaN
// or their lengths differ.
/** @param {Float32Array} a @param {Float32Array} b */
export function relativeDiff(a, b) {
  if (a.length !== b.length) return Infinity;
  let scale = 0, diff = 0;
  for (let i = 0; i < a.length; i++) {
    const d = Math.abs(a[i] - b[i]);
    if (Number.isNaN(d)) return Infinity;
    scale = Math.max(scale, Math.abs(a[i]));
    diff = Math.max(diff, d);
  }
  return diff / Math.max(scale, 1e-30);
}

// GPU tensors hold GPU memory until disposed; CPU tensors are left to the collector.
/** @param {Feeds | null | undefined} tensors */
function dispose(tensors) {
  for (const t of Object.values(tensors ?? {})) if (t?.location === 'gpu-buffer') t.dispose();
}

// Captured decode steps: onnxruntime-web records one decode step of the decoder's step form
// (webbuild/forms/step.py) and replays it for every later token, without the per-kernel bind
// groups, uniform writes and dispatch calls of a plain run (docs/graph-capture.md). The prompt still
// runs in the plain decoder session; its KV cache is then copied into static buffers of T positions
// that the step session reads and writes in place.
//
// The step form chooses the next token on the GPU and writes it into its own input buffer, so a step
// needs nothing from the CPU but the mask's next position: issue() queues a step and its 12-byte
// read-back (token, margin) without waiting for the previous step's, and the caller keeps a few steps
// in flight (asr.js), reading the tokens as they arrive.
//
// A build with LoRA adapters has a second step session, the adapted decoder's (runtime/lora.js): it
// reads and writes the same static buffers as the base one (only one decodes at a time) and binds the
// adapter inputs once, like every other input; the registrations it pins are the same ones.
//
// onnxruntime-web 1.30 needs three things for capture to work (docs/graph-capture.md has the source lines):
// - the EP named as an object, or enableGraphCapture never reaches it;
// - every input and output a GPU tensor on the same buffer in every run;
// - the buffers' registrations kept alive: in capture mode the JS binds the tensors once, in the first
//   run, but unregisters every buffer at the end of each run, so the bound handles would go stale.
//   The first run takes one more reference on each registration (onnxruntime-web's private
//   'gpuBufferMetadata' [handle, count] on the GPUBuffer). Where that is not there, or a replay does
//   not hand back the buffers it was given, create() or issue() throws and the caller decodes plainly.

import { kvNames } from './contract.js';

/** @typedef {import('webbuild-types').Ort} Ort */
/** @typedef {import('webbuild-types').OrtSession} OrtSession */
/** @typedef {import('webbuild-types').OrtTensor} OrtTensor */
/** @typedef {import('webbuild-types').Runtime} Runtime */

const PIN = 'gpuBufferMetadata';
const BYTES = { float32: 4, float16: 2, int64: 8, int32: 4 };
const READ_BYTES = 16; // the token (int32) at 0, its margin (float32) at 8
export const IN_FLIGHT = 3; // steps queued ahead of the token being read
const MAX_IN_FLIGHT = 16; // what `inFlight` may be set to (a bench's trace): one staging buffer each, and one more
const USAGE = () => GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;

export class CapturedSteps {
  // bytes/externalData: the step graph and the decoder's weights; d: runtime.decoder; io: runtime.io, the
  // graphs' input and output names (webbuild/site/contract.py IO); positions: T.
  // shared: another CapturedSteps whose static buffers this one reads and writes too (the base steps, for
  // the adapted ones: one decodes at a time); extraFeeds: given the step graph's input names, GPU tensors bound
  // once beside its own inputs (the adapted graph's lora.* inputs, runtime/lora-inputs.js stepFeedsFor).
  /**
   * @param {Ort} ort
   * @param {string | {name: string, device?: GPUDevice}} provider
   * @param {Uint8Array} bytes
   * @param {{path: string, data: Uint8Array}[] | undefined} externalData
   * @param {Runtime['decoder']} d
   * @param {Runtime['io']} io
   * @param {number} positions
   * @param {'float16' | 'float32'} dtype
   * @param {{shared?: CapturedSteps | null, extraFeeds?: (names: readonly string[]) => Record<string, OrtTensor>,
   *   options?: import('webbuild-types').OrtSessionOptions}} [options] options: the session's other options, the
   *   decoder's (asr.js sessionOptions: its graph optimizations, its log level)
   */
  static async create(ort, provider, bytes, externalData, d, io, positions, dtype,
    { shared = null, extraFeeds = () => ({}), options = {} } = {}) {
    const session = await ort.InferenceSession.create(bytes, {
      ...options, externalData,
      executionProviders: [typeof provider === 'string' ? { name: provider } : provider],
      enableGraphCapture: true, preferredOutputLocation: 'gpu-buffer',
    });
    // the device the sessions run on: the site's own (probe.js webgpuProvider), else onnxruntime-web's
    const device = (typeof provider === 'string' ? undefined : provider.device) ?? await ort.env.webgpu.device;
    const buffers = shared?.buffers ?? new StepBuffers(ort, device, d, positions, dtype);
    return new CapturedSteps(ort, device, session, d, io, positions, dtype, buffers, extraFeeds(session.inputNames));
  }

  /**
   * @param {Ort} ort
   * @param {GPUDevice} device
   * @param {OrtSession} session
   * @param {Runtime['decoder']} d
   * @param {Runtime['io']} io
   * @param {number} positions
   * @param {'float16' | 'float32'} dtype
   * @param {StepBuffers} buffers
   * @param {Record<string, OrtTensor>} [extraFeeds]
   */
  constructor(ort, device, session, d, io, positions, dtype, buffers, extraFeeds = {}) {
    this.ort = ort;
    this.device = device;
    this.session = session;
    this.d = d;
    this.io = io;
    this.positions = positions;
    this.dtype = dtype;
    this.buffers = buffers;
    for (const name of [io.next_token, io.margin]) {
      if (!session.outputNames.includes(name)) throw new Error(`capture: the step graph has no ${name} output`);
    }
    this.ids = buffers.ids;
    this.mask = buffers.mask;
    this.margin = buffers.margin;
    this.staging = buffers.staging;
    /** @type {Record<string, OrtTensor>} */
    this.feeds = { [io.input_ids]: this.ids, [io.attention_mask]: this.mask, ...extraFeeds };
    /** @type {Record<string, OrtTensor>} */
    this.fetches = { [io.next_token]: this.ids, [io.margin]: this.margin };
    this.kv = kvNames(io, d.num_layers);
    this.kv.forEach((n, i) => {
      this.feeds[n.past] = buffers.kv[i];
      this.fetches[n.present] = buffers.kv[i]; // in place: GroupQueryAttention appends to it
    });
    this.recorded = false;
    this.inFlight = IN_FLIGHT; // steps asr.js queues ahead of the token it reads, at most MAX_IN_FLIGHT
  }

  // Whether a chunk with `prompt` positions and up to `newTokens` steps fits the static cache.
  /** @param {number} prompt @param {number} newTokens */
  fits(prompt, newTokens) {
    return prompt + newTokens <= this.positions;
  }

  // Takes over after the plain prefill: its KV cache (GPU tensors [1, kv, P, hd] by past input name, asr.js) copied head by head
  // into the static buffers, the mask set to P ones, `token` (the prefill's choice) as the first input.
  /**
   * @param {Record<string, OrtTensor>} present
   * @param {number} total
   * @param {number} token
   */
  begin(present, total, token) {
    const { num_key_value_heads: heads, head_dim: hd } = this.d;
    const row = hd * BYTES[this.dtype];
    const enc = this.device.createCommandEncoder();
    for (const { past } of this.kv) {
      const src = present[past];
      if (src.location !== 'gpu-buffer' || src.dims[2] !== total) throw new Error(`capture: prefill KV ${src.location} ${src.dims}`);
      const dst = this.feeds[past].gpuBuffer;
      for (let h = 0; h < heads; h++) enc.copyBufferToBuffer(src.gpuBuffer, h * total * row, dst, h * this.positions * row, total * row);
    }
    this.device.queue.submit([enc.finish()]);
    const mask = new BigInt64Array(this.positions);
    mask.fill(1n, 0, total);
    this.device.queue.writeBuffer(this.mask.gpuBuffer, 0, mask);
    this.device.queue.writeBuffer(this.ids.gpuBuffer, 0, Int32Array.of(token));
  }

  // Queues one decode step at position total - 1 (its input: the previous step's choice, or begin()'s
  // token). Resolves once the step is submitted, to {pick}: a promise of the step's {token, margin}.
  /**
   * @param {number} total
   * @returns {Promise<{pick: Promise<import('./greedy.js').Pick>}>}
   */
  async issue(total) {
    this.device.queue.writeBuffer(this.mask.gpuBuffer, (total - 1) * 8, BigInt64Array.of(1n));
    const out = await (this.recorded ? this.session.run(this.feeds, this.fetches) : this.record());
    if (out[this.io.next_token].gpuBuffer !== this.ids.gpuBuffer) throw new Error('capture: a replay answered on other buffers');
    const staging = this.staging[this.buffers.issued++ % this.staging.length];
    const enc = this.device.createCommandEncoder();
    enc.copyBufferToBuffer(this.ids.gpuBuffer, 0, staging, 0, 4);
    enc.copyBufferToBuffer(this.margin.gpuBuffer, 0, staging, 8, 4);
    this.device.queue.submit([enc.finish()]);
    return { pick: readPick(staging) };
  }

  // The first run records the step; the registrations are pinned during it (see the top of the file).
  async record() {
    const buffers = [...new Set([...Object.values(this.feeds), ...Object.values(this.fetches)].map((t) => t.gpuBuffer))];
    const device = this.device;
    let pinned = null;
    device.createBindGroup = function (desc) {
      pinned ??= pin(buffers);
      return Object.getPrototypeOf(device).createBindGroup.call(this, desc);
    };
    try {
      const out = await this.session.run(this.feeds, this.fetches);
      if (pinned !== true) throw new Error(`capture: ${pinned ?? 'no bind group was made in the first run'}`);
      this.recorded = true;
      return out;
    } finally {
      delete /** @type {{createBindGroup?: unknown}} */ (device).createBindGroup;
    }
  }
}

// The static buffers of the captured decode: the token in and out (one buffer), the mask, the margin, the
// KV cache of T positions, and the read-back staging buffers. Made once; the adapted steps share them.
class StepBuffers {
  /**
   * @param {Ort} ort
   * @param {GPUDevice} device
   * @param {Runtime['decoder']} d
   * @param {number} positions
   * @param {'float16' | 'float32'} dtype
   */
  constructor(ort, device, d, positions, dtype) {
    this.ort = ort;
    this.device = device;
    this.ids = this.tensor('int32', [1, 1]); // the token in, and the next one out: one buffer
    this.mask = this.tensor('int64', [1, positions]);
    this.margin = this.tensor('float32', [1, 1]);
    // per layer key then value, as contract.js kvNames lists them
    this.kv = Array.from({ length: 2 * d.num_layers }, () => this.tensor(dtype, [1, d.num_key_value_heads, positions, d.head_dim]));
    // one staging buffer per step in flight (and one more: a buffer is mapped until its token is read)
    this.staging = Array.from({ length: MAX_IN_FLIGHT + 1 },
      () => device.createBuffer({ size: READ_BYTES, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST }));
    this.issued = 0;
  }

  /**
   * @param {'float16' | 'float32' | 'int64' | 'int32'} type
   * @param {number[]} dims
   */
  tensor(type, dims) {
    const size = dims.reduce((a, b) => a * b, 1) * BYTES[type];
    const buffer = this.device.createBuffer({ size: Math.ceil(size / 16) * 16, usage: USAGE() });
    return this.ort.Tensor.fromGpuBuffer(buffer, { dataType: type, dims });
  }
}

/**
 * @param {GPUBuffer} staging
 * @returns {Promise<import('./greedy.js').Pick>}
 */
async function readPick(staging) {
  await staging.mapAsync(GPUMapMode.READ);
  try {
    const bytes = staging.getMappedRange();
    return { token: new Int32Array(bytes, 0, 1)[0], margin: new Float32Array(bytes, 8, 1)[0] };
  } finally {
    staging.unmap();
  }
}

// One more reference on each buffer's onnxruntime-web registration; true, or why it could not.
/** @param {GPUBuffer[]} buffers */
function pin(buffers) {
  const metas = buffers.map((b) => {
    const sym = Object.getOwnPropertySymbols(b).find((s) => s.description === PIN);
    return sym && /** @type {Record<symbol, any>} */ (/** @type {unknown} */ (b))[sym]; // onnxruntime-web's private field: untyped
  });
  if (!metas.every((m) => Array.isArray(m) && m.length === 2 && typeof m[1] === 'number')) {
    return `onnxruntime-web's '${PIN}' registration is not there`;
  }
  for (const m of metas) m[1]++;
  return true;
}

// The adapted graphs' lora.* inputs, made once (at load) and then only rewritten (docs/adapters.md, "In the
// browser"):
// - WebGPU: one GPU buffer per input, zero-filled (an adapter of zeros is the base model) and kept for the page's
//   life. Graph capture (capture.js) replays with the buffers it recorded, so a switch may only write new values
//   into them (`device.queue.writeBuffer`): switching allocates no GPU buffer and, the adapted graphs having been
//   warmed up on the zeros, compiles no shader.
// - wasm: CPU tensors, replaced at each switch.
// Every adapter of a build has the same inputs and shapes, so one set of tensors serves them all. The step form's
// inputs are made as the manifest variant's `lora_layout` says (lora-encode.js), by record, not by name.

import { deltaRuns, runDeltas } from './lora-delta.js';
import { startValue, stepOffset } from './lora-encode.js';

/** @typedef {import('webbuild-types').Ort} Ort */
/** @typedef {import('webbuild-types').OrtTensor} OrtTensor */
/** @typedef {import('./lora-encode.js').LoraLayout} LoraLayout */
/** @typedef {import('./lora-encode.js').LoraValues} LoraValues */

export class LoraInputs {
  // shapes: loraShapes(manifest); dtype: the variant's float type; device: the sessions' GPUDevice on WebGPU (GPU
  // tensors), null on wasm (CPU tensors).
  /**
   * @param {Ort} ort
   * @param {Record<string, number[]>} shapes
   * @param {'float16' | 'float32'} dtype
   * @param {GPUDevice | null} [device]
   * @param {{layout?: LoraLayout, file?: (name: string) => Uint8Array | undefined,
   *   delta?: import('webbuild-types').OrtSession | null}} [step] the manifest variant's lora_layout (the step form's
   *   inputs), the loaded files by name (a joint's base rows come from the decoder's weights file, at load) and the
   *   delta graph's session (the merged updates it makes at a switch)
   */
  constructor(ort, shapes, dtype, device = null, step = {}) {
    this.ort = ort;
    this.dtype = dtype;
    this.device = device;
    this.shapes = shapes;
    /** @type {Record<string, number[]>} the rows of each GPU buffer that may hold non-zero values now */
    this.written = {};
    /** @type {Record<string, OrtTensor>} the adapted graph's inputs */
    this.feeds = {};
    for (const [name, dims] of Object.entries(shapes)) this.feeds[name] = device ? this.gpuTensor(dims) : this.cpuTensor(dims);
    this.layout = step.layout ?? {};
    this.file = step.file ?? (() => undefined);
    this.delta = step.delta ?? null;
    /** @type {Record<string, OrtTensor>} its step form's (WebGPU only, made by stepFeedsFor) */
    this.stepFeeds = {};
  }

  // The step form's lora inputs among `names` (its session's inputNames), made once: a `float` record's is the
  // adapted graph's tensor; any other gets a GPU buffer of its own, holding what it holds before any adapter.
  /** @param {readonly string[]} names */
  stepFeedsFor(names) {
    for (const name of names.filter((n) => !(n in this.stepFeeds))) {
      const r = this.layout[name];
      if (!r) continue; // not an adapter input
      if (r.kind === 'float') {
        this.stepFeeds[name] = this.feeds[r.from[0]];
        continue;
      }
      if (r.kind === 'delta' && !this.delta) throw new Error(`adapted step input ${name}: the build ships no delta graph to make it; rebuild the site`);
      this.stepFeeds[name] = this.gpuTensor(r.dims, r.part === 'codes' ? 'uint8' : this.dtype);
      const start = startValue(r, this.dtype, this.file);
      if (start) this.write(name, start);
    }
    return Object.fromEntries(names.filter((n) => n in this.stepFeeds).map((n) => [n, this.stepFeeds[n]]));
  }

  // The merged updates from the adapted graph's downs and ups, as they are now (lora-delta.js).
  async computeDeltas() {
    if (this.delta) await runDeltas(this.delta, deltaRuns(this.layout, this.feeds, this.stepFeeds));
  }

  // A zero-filled GPU tensor (WebGPU zero-initialises new buffers): the base model until an adapter is written.
  /**
   * @param {number[]} dims
   * @param {'float16' | 'float32' | 'uint8'} [dataType]
   */
  gpuTensor(dims, dataType = this.dtype) {
    if (!this.device) throw new Error('GPU tensors need the sessions\' GPUDevice');
    const bytes = dims.reduce((a, b) => a * b) * { float16: 2, float32: 4, uint8: 1 }[dataType];
    const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
    const buffer = this.device.createBuffer({ size: Math.ceil(bytes / 16) * 16, usage });
    return this.ort.Tensor.fromGpuBuffer(buffer, { dataType, dims });
  }

  /**
   * @param {number[]} dims
   * @param {Float32Array | Uint16Array | null} [data]
   */
  cpuTensor(dims, data = null) {
    const Type = this.dtype === 'float16' ? Uint16Array : Float32Array;
    return new this.ort.Tensor(this.dtype, data ?? new Type(dims[0] * dims[1]), dims);
  }

  // An adapter's values (lora.js loraValues in this dtype) into the inputs: written into the same GPU buffers,
  // or new CPU tensors. rows (loraRows): where the values may be non-zero; a GPU buffer gets those rows and
  // the ones the adapter before may have filled (an up's own rows of its group: a third of the values).
  // The step's merged updates are then computed from them (computeDeltas).
  /**
   * @param {LoraValues} values
   * @param {Record<string, number[]>} [rows]
   */
  async set(values, rows = {}) {
    for (const [name, dims] of Object.entries(this.shapes)) {
      const data = /** @type {Float32Array<ArrayBuffer> | Uint16Array<ArrayBuffer>} a float input's */ (values[name]);
      if (!data || data.length !== dims[0] * dims[1]) throw new Error(`adapter input ${name}: expected ${dims.join('x')} values`);
      if (!this.device) {
        this.feeds[name] = this.cpuTensor(dims, data);
        continue;
      }
      const now = rows[name] ?? [0, dims[0]], before = this.written[name] ?? now;
      this.writeRows(name, data, dims[1], Math.min(now[0], before[0]), Math.max(now[1], before[1]));
      this.written[name] = now;
    }
    for (const name of Object.keys(this.stepFeeds)) {
      const r = this.layout[name];
      if (r.kind === 'float' || r.kind === 'delta') continue; // the adapted graph's: written above; merged: below
      const data = values[name];
      if (!data) throw new Error(`adapter input ${name}: no values (lora.js loraValues makes them)`);
      this.write(name, data, stepOffset(r, data));
    }
    await this.computeDeltas();
  }

  // All of `data` into a step input's GPU buffer, from byte `offset`.
  /**
   * @param {string} name
   * @param {Float32Array<ArrayBuffer> | Uint16Array<ArrayBuffer> | Uint8Array<ArrayBuffer>} data
   * @param {number} [offset]
   */
  write(name, data, offset = 0) {
    /** @type {GPUDevice} */ (this.device).queue.writeBuffer(this.stepFeeds[name].gpuBuffer, offset, data);
  }

  // Rows [start, stop) of `data` ([K, N] row-major) into the input's GPU buffer, at 4-byte bounds (float16:
  // an odd N writes every row).
  /**
   * @param {string} name
   * @param {Float32Array<ArrayBuffer> | Uint16Array<ArrayBuffer>} data
   * @param {number} n
   * @param {number} start
   * @param {number} stop
   */
  writeRows(name, data, n, start, stop) {
    if (data.BYTES_PER_ELEMENT === 2 && n % 2) [start, stop] = [0, data.length / n];
    if (stop <= start) return;
    const device = /** @type {GPUDevice} */ (this.device);
    device.queue.writeBuffer(this.feeds[name].gpuBuffer, start * n * data.BYTES_PER_ELEMENT, data, start * n, (stop - start) * n);
  }
}

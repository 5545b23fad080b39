// The decoder's weights uploaded once, for the shared-weights forms (webbuild/forms/shared_weights.py): each weight
// of the manifest's table a GPU tensor written straight from the downloaded weights file, fed as a graph input to
// every session of the decoder (the prefill session and the captured step), which then upload none of their own.

/** @typedef {import('webbuild-types').Ort} Ort */
/** @typedef {import('webbuild-types').OrtTensor} OrtTensor */
/** @typedef {{type: string, dims: number[], offset: number, length: number}} WeightEntry */

// the table's numpy type names as onnxruntime-web's tensor types
const TYPES = /** @type {Record<string, string>} */ ({ float32: 'float32', float16: 'float16', uint8: 'uint8', int8: 'int8',
  int32: 'int32', int64: 'int64', bool: 'bool' });

/**
 * @param {Ort} ort
 * @param {GPUDevice} device the sessions' device
 * @param {Uint8Array} file the weights file
 * @param {Record<string, WeightEntry>} table the manifest variant's `weights`
 * @returns {Record<string, OrtTensor>} by input name
 */
export function uploadWeights(ort, device, file, table) {
  /** @type {Record<string, OrtTensor>} */
  const tensors = {};
  for (const [name, { type, dims, offset, length }] of Object.entries(table)) {
    const dataType = TYPES[type];
    if (!dataType) throw new Error(`weight ${name}: type ${type} is not one onnxruntime-web takes`);
    if (offset + length > file.byteLength) throw new Error(`weight ${name}: bytes ${offset}-${offset + length} past the file's end`);
    const size = Math.ceil(length / 16) * 16; // writeBuffer copies whole 4-byte words; onnxruntime's buffers round to 16
    const buffer = device.createBuffer({ size, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST });
    const bytes = file.subarray(offset, offset + length);
    device.queue.writeBuffer(buffer, 0, /** @type {Uint8Array<ArrayBuffer>} */ (length % 4 ? padded(bytes) : bytes));
    tensors[name] = ort.Tensor.fromGpuBuffer(buffer, { dataType: /** @type {'float32'} */ (dataType), dims });
  }
  return tensors;
}

// The tensors of `weights` a session takes, by its input names.
/** @param {Record<string, OrtTensor>} weights @param {readonly string[]} names */
export function weightFeeds(weights, names) {
  return Object.fromEntries(names.filter((n) => n in weights).map((n) => [n, weights[n]]));
}

/** @param {Uint8Array} bytes */
function padded(bytes) {
  const out = new Uint8Array(Math.ceil(bytes.length / 4) * 4);
  out.set(bytes);
  return out;
}

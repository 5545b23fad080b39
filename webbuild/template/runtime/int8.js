// The uint8 weights of an int8 wasm twin (webbuild/quantize/wasm_twin.py), derived at load from the int4
// codes and scales the site ships: nothing more to download. The twin's plan (role `<graph>_wasm_int8`)
// names the weights file this makes, the shipped file it reads, and per weight where its codes and float32
// scales lie there, its K x N and block size, and where its [K, N] uint8 (zero point 128) goes. The
// arithmetic is wasm_twin.int8_codes', in float64 both: the same bytes as the Python reference's.

/**
 * @typedef {{codes: [number, number], scales: [number, number], k: number, n: number, block: number, at: number}} Int8Tensor
 * @typedef {{file: string, source: string, bytes: number, tensors: Int8Tensor[]}} Int8Plan
 */

/** @param {Uint8Array} bytes the plan file, JSON */
export const readInt8Plan = (bytes) => /** @type {Int8Plan} */ (JSON.parse(new TextDecoder().decode(bytes)));

// The plan's weights file, from its source file's bytes.
/**
 * @param {Int8Plan} plan
 * @param {Uint8Array} source
 */
export function int8Weights(plan, source) {
  const out = new Uint8Array(plan.bytes);
  for (const t of plan.tensors) deriveWeight(t, source, out);
  return out;
}

// One weight: per column n the int4 block values c * s mapped onto -127..127 by the column's largest
// scale m, q = floor(c * 15.875 * (s / m) + 0.5), written transposed ([K, N]) with zero point 128.
/**
 * @param {Int8Tensor} t
 * @param {Uint8Array} source
 * @param {Uint8Array} out
 */
function deriveWeight({ codes: [codesAt], scales: [scalesAt, scalesLength], k, n, block, at }, source, out) {
  const blocks = Math.ceil(k / block), half = block / 2;
  // a copy: the scales' offset in the file need not be 4-byte aligned (new Uint8Array copies, where a
  // Node Buffer's slice would not)
  const scales = new Float32Array(new Uint8Array(source.subarray(scalesAt, scalesAt + scalesLength)).buffer);
  const table = new Uint8Array(16); // a block's 16 code values
  for (let col = 0; col < n; col++) {
    let m = 0;
    for (let b = 0; b < blocks; b++) m = Math.max(m, Math.abs(scales[col * blocks + b]));
    for (let b = 0; b < blocks; b++) {
      const ratio = m > 0 ? scales[col * blocks + b] / m : 0;
      for (let c = 0; c < 16; c++) table[c] = Math.floor((c - 8) * 15.875 * ratio + 0.5) + 128;
      const from = codesAt + (col * blocks + b) * half;
      for (let j = 0, row = b * block; j < half; j++, row += 2) {
        const byte = source[from + j];
        if (row < k) out[at + row * n + col] = table[byte & 15]; // low nibble first
        if (row + 1 < k) out[at + (row + 1) * n + col] = table[byte >> 4];
      }
    }
  }
}

// Greedy decoding's choice from a step's logits, in float32 whatever the graph's output type.

import { halfsToFloats } from './half.js';

/** @typedef {{token: number, margin: number}} Pick  a greedy choice and its logit minus the runner-up's */

// fp16 tensors arrive as raw bits (Uint16Array) or, in browsers that have it, Float16Array.
/**
 * @param {ArrayLike<number>} data
 * @returns {Float32Array}
 */
export function toFloat32(data) {
  if (!(data instanceof Uint16Array)) return data instanceof Float32Array ? data : Float32Array.from(data);
  return halfsToFloats(data);
}

// Greedy choice over the last position (a pruned graph has only that one): {token, margin}, the
// margin being the chosen logit minus the runner-up's. The first maximum wins ties, as numpy's argmax does.
/**
 * @param {import('webbuild-types').OrtTensor} logits float32 or float16
 * @param {number} vocab
 * @returns {Pick}
 */
export function pickLast(logits, vocab) {
  return pick(lastRow(logits, vocab));
}

// The last position's `vocab` logits, as float32.
/**
 * @param {import('webbuild-types').OrtTensor} logits float32 or float16
 * @param {number} vocab
 */
export function lastRow(logits, vocab) {
  const data = /** @type {Float32Array | Uint16Array} */ (logits.data);
  return toFloat32(data.subarray(data.length - vocab));
}

/**
 * @param {import('webbuild-types').OrtTensor} logits
 * @param {number} vocab
 */
export function argmaxLast(logits, vocab) {
  return pickLast(logits, vocab).token;
}

// {token, margin} over one row of float32 logits.
/**
 * @param {Float32Array} row
 * @returns {Pick}
 */
export function pick(row) {
  let best = 0, bestV = row[0], second = -Infinity;
  for (let i = 1; i < row.length; i++) {
    const v = row[i];
    if (v > bestV) {
      second = bestV;
      bestV = v;
      best = i;
    } else if (v > second) second = v;
  }
  return { token: best, margin: bestV - second };
}

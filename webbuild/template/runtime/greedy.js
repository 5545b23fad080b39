// Greedy decoding's choice from a step's logits, in float32 whatever the graph's output type.

import { halfsToFloats } from './half.js';

// fp16 tensors arrive as raw bits (Uint16Array) or, in browsers that have it, Float16Array.
export function toFloat32(data) {
  if (!(data instanceof Uint16Array)) return data instanceof Float32Array ? data : Float32Array.from(data);
  return halfsToFloats(data);
}

// Greedy choice over the last position (a pruned graph has only that one): {token, margin}, the
// margin being the chosen logit minus the runner-up's. The first maximum wins ties, as numpy's argmax does.
export function pickLast(logits, vocab) {
  return pick(toFloat32(logits.data.subarray(logits.data.length - vocab)));
}

export function argmaxLast(logits, vocab) {
  return pickLast(logits, vocab).token;
}

// {token, margin} over one row of float32 logits.
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

// Greedy decoding's choice from a step's logits, in float32 whatever the graph's output type.

// fp16 tensors arrive as raw bits (Uint16Array) or, in browsers that have it, Float16Array.
export function toFloat32(data) {
  if (!(data instanceof Uint16Array)) return data instanceof Float32Array ? data : Float32Array.from(data);
  const out = new Float32Array(data.length);
  for (let i = 0; i < data.length; i++) out[i] = halfToFloat(data[i]);
  return out;
}

function halfToFloat(h) {
  const exp = (h >> 10) & 0x1f;
  const frac = h & 0x3ff;
  const sign = h & 0x8000 ? -1 : 1;
  if (exp === 0) return sign * 2 ** -14 * (frac / 1024);
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return sign * 2 ** (exp - 15) * (1 + frac / 1024);
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

// Summary statistics for timing lists (quantiles by linear interpolation between ranks).

/**
 * @param {number[]} xs
 * @param {number} q in [0, 1]
 */
export function quantile(xs, q) {
  if (!xs.length) return null;
  const s = [...xs].sort((a, b) => a - b);
  const at = (s.length - 1) * q;
  const lo = Math.floor(at);
  return s[lo] + (at - lo) * ((s[lo + 1] ?? s[lo]) - s[lo]);
}

/** @param {number[]} xs */
export const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;

/** @param {number[]} xs */
export const spread = (xs) => ({ median: quantile(xs, 0.5), p10: quantile(xs, 0.1), p90: quantile(xs, 0.9), n: xs.length });

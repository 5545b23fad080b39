// An int8 twin's plan (runtime/int8.js) and its source bytes, for int4 weights of the given K x N with random
// codes and scales (a fixed seed): each weight's codes [N, blocks, 16] then float32 scales [N * blocks], at odd
// offsets, as a real weights file's need not be aligned. For bench-int8.mjs (Node) and int8.html (Chromium).

/** @param {number[][]} shapes [K, N] each @param {number} [block] */
export function synthetic(shapes, block = 32) {
  const tensors = [], parts = [];
  let size = 3, at = 0;
  for (const [k, n] of shapes) {
    const blocks = Math.ceil(k / block), codes = n * blocks * block / 2, scales = n * blocks * 4;
    tensors.push({ codes: [size, codes], scales: [size + codes, scales], k, n, block, at });
    parts.push({ at: size, codes, blocks: n * blocks });
    size += codes + scales + 1;
    at += Math.ceil(k * n / 64) * 64;
  }
  const source = new Uint8Array(size);
  let seed = 1;
  const random = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32);
  for (const p of parts) {
    for (let i = 0; i < p.codes; i++) source[p.at + i] = (random() * 256) | 0;
    const scales = new Float32Array(p.blocks);
    for (let i = 0; i < p.blocks; i++) scales[i] = (random() - 0.5) * 0.02;
    source.set(new Uint8Array(scales.buffer), p.at + p.codes);
  }
  return { plan: { file: 'w.int8.bin', source: 'w.data', bytes: at, tensors }, source };
}

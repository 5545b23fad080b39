// The uint8 weights of an int8 wasm twin (webbuild/forms/wasm_twin.py), derived at load from the int4
// codes and scales the site ships: nothing more to download. The twin's plan (role `<graph>_wasm_int8`)
// names the weights file this makes, the shipped file it reads, and per weight where its codes and float32
// scales lie there, its K x N and block size, and where its [K, N] uint8 (zero point 128) goes. The
// arithmetic is webbuild/graph/packing.py int8_codes', in float64 both: the same bytes as the Python reference's.

/**
 * @typedef {{codes: [number, number], scales: [number, number], k: number, n: number, block: number, at: number}} Int8Tensor
 * @typedef {{file: string, source: string, bytes: number, tensors: Int8Tensor[], keep?: [number, number][]}} Int8Plan
 */

/** @param {Uint8Array} bytes the plan file, JSON */
export const readInt8Plan = (bytes) => /** @type {Int8Plan} */ (JSON.parse(new TextDecoder().decode(bytes)));

// What the twin itself reads of its source file (the plan's `keep` ranges), at the same offsets in a buffer of the
// file's length: the rest stays zero, pages the system never backs with memory, so the int4 weights the uint8 ones
// replace need not stay resident while the session copies its weights in.
/**
 * @param {Uint8Array} source
 * @param {[number, number][]} keep
 */
export function keptRanges(source, keep) {
  const out = new Uint8Array(source.length);
  for (const [at, length] of keep) out.set(source.subarray(at, at + length), at);
  return out;
}

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
// Four columns at a time (a quad): per block each column's 16 code values' bytes are computed once
// (quadTables, codeTable: half the float products, by symmetry), then each row's four bytes are looked up
// and stored as one 32-bit word (little endian, as every browser's platform is): a quarter of the stores,
// strided down [K, N] (BENCHMARKS.md "wasm kernels and the int8 form": 1.9x faster than a byte at a time).
// Where N is not a multiple of 4, columns go one at a time, a byte at a time.
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
  const peaks = columnPeaks(scales, n, blocks);
  const quads = (out.byteOffset + at) % 4 === 0 && n % 4 === 0 ? n / 4 : 0; // rows of whole words
  const words = new Uint32Array(out.buffer, out.byteOffset + at, quads && (k * n) / 4);
  const tables = new Uint32Array(64);
  for (let quad = 0; quad < quads; quad++) {
    for (let b = 0; b < blocks; b++) {
      quadTables(scales, peaks, quad * 4, blocks, b, tables);
      const from = codesAt + quad * 4 * blocks * half + b * half, stride = blocks * half;
      for (let j = 0, row = b * block, to = quad + row * (n >> 2); j < half && row < k; j++, row += 2) {
        const c0 = source[from + j], c1 = source[from + stride + j];
        const c2 = source[from + 2 * stride + j], c3 = source[from + 3 * stride + j];
        words[to] = tables[c0 & 15] | tables[16 + (c1 & 15)] | tables[32 + (c2 & 15)] | tables[48 + (c3 & 15)];
        to += n >> 2; // low nibbles first
        if (row + 1 < k) words[to] = tables[c0 >> 4] | tables[16 + (c1 >> 4)] | tables[32 + (c2 >> 4)] | tables[48 + (c3 >> 4)];
        to += n >> 2;
      }
    }
  }
  const table = new Uint8Array(16);
  for (let col = quads ? n : 0; col < n; col++) {
    for (let b = 0; b < blocks; b++) {
      codeTable(scales[col * blocks + b], peaks[col], table, 0, 0);
      const from = codesAt + (col * blocks + b) * half;
      for (let j = 0, row = b * block; j < half; j++, row += 2) {
        const byte = source[from + j];
        if (row < k) out[at + row * n + col] = table[byte & 15]; // low nibble first
        if (row + 1 < k) out[at + (row + 1) * n + col] = table[byte >> 4];
      }
    }
  }
}

// Each column's largest |scale|.
/**
 * @param {Float32Array} scales
 * @param {number} n
 * @param {number} blocks
 */
function columnPeaks(scales, n, blocks) {
  const peaks = new Float64Array(n);
  for (let col = 0, i = 0; col < n; col++) {
    let m = 0;
    for (let b = 0; b < blocks; b++, i++) m = Math.max(m, Math.abs(scales[i]));
    peaks[col] = m;
  }
  return peaks;
}

// Block b's tables of the quad from column `first`: column c's 16 bytes at 16 c, shifted to its byte of a word.
/**
 * @param {Float32Array} scales
 * @param {Float64Array} peaks
 * @param {number} first
 * @param {number} blocks
 * @param {number} b
 * @param {Uint32Array} tables
 */
function quadTables(scales, peaks, first, blocks, b, tables) {
  for (let c = 0; c < 4; c++) {
    const col = first + c;
    codeTable(scales[col * blocks + b], peaks[col], tables, 16 * c, 8 * c);
  }
}

// The bytes of one block's 16 code values v, floor((v - 8) * 15.875 * ratio + 0.5) + 128, at `to` in `table`
// (shifted left by `shift`). Code 8 - d's value is code 8 + d's negated, and IEEE rounding is symmetric: with
// x = d * 15.875 * ratio, the same double either way, -x + 0.5 rounds to -(x - 0.5) rounded, so
// floor(-x + 0.5) = -ceil(x - 0.5): one product for both, the same bytes.
/**
 * @param {number} scale
 * @param {number} m the column's largest |scale|
 * @param {Uint8Array | Uint32Array} table
 * @param {number} to
 * @param {number} shift
 */
function codeTable(scale, m, table, to, shift) {
  const ratio = m > 0 ? scale / m : 0;
  table[to + 8] = (Math.floor(0 * ratio + 0.5) + 128) << shift; // code 8: 128, or 0 where ratio is NaN (an infinite scale)
  for (let d = 1; d < 8; d++) {
    const x = d * 15.875 * ratio;
    table[to + 8 + d] = (Math.floor(x + 0.5) + 128) << shift;
    table[to + 8 - d] = (128 - Math.ceil(x - 0.5)) << shift;
  }
  table[to] = (128 - Math.ceil(127 * ratio - 0.5)) << shift; // d = 8: 8 * 15.875
}

// int8Weights' bytes, the work shared by up to `count` module workers (int8-worker.js) where this context
// can start them (the page's worker can; Node cannot): each takes a run of one weight's columns at a time
// (a column's bytes depend on that column alone), its codes and scales copied to it, and sends back its
// [K, width] rows, copied into place here. Small plans, one worker, or workers that fail to start: here.
/**
 * @param {Int8Plan} plan
 * @param {Uint8Array} source
 * @param {number} count
 * @returns {Promise<{bytes: Uint8Array, workers: number, ms: number}>} workers: how many did the work (0: this
 *   thread); ms: from the start to the last byte (not the time this promise takes to be seen resolved)
 */
export async function int8WeightsInWorkers(plan, source, count) {
  const t0 = performance.now(), runs = columnRuns(plan);
  const here = () => ({ bytes: int8Weights(plan, source), workers: 0, ms: performance.now() - t0 });
  count = Math.min(count, runs.length);
  if (count < 2 || plan.bytes < IN_WORKERS_FROM || typeof Worker === 'undefined') return here();
  /** @type {Worker[]} */
  const pool = [];
  try {
    for (let i = 0; i < count; i++) pool.push(new Worker(new URL('./int8-worker.js', import.meta.url), { type: 'module' }));
    const out = new Uint8Array(plan.bytes);
    let next = 0;
    await Promise.all(pool.map((worker) => new Promise((resolve, reject) => {
      const give = () => {
        if (next === runs.length) return resolve(undefined);
        const run = runs[next++], job = runJob(run, source);
        worker.onmessage = ({ data }) => { placeRun(run, data, out); give(); };
        worker.postMessage(job, [job.source.buffer]);
      };
      worker.onerror = (ev) => { ev.preventDefault?.(); reject(new Error(ev.message)); };
      give();
    })));
    return { bytes: out, workers: count, ms: performance.now() - t0 };
  } catch { // e.g. a policy that forbids workers: the same bytes here
    return here();
  } finally {
    for (const worker of pool) worker.terminate();
  }
}

// How many workers share the derivation on this device: none below 4 cores (on 2, the copies and the workers'
// start cost about what a second core saves: tests/js/int8.test.mjs), else one a core but this thread's, up to 8.
export function int8Workers(cores = globalThis.navigator?.hardwareConcurrency || 1) {
  return cores >= 4 ? Math.min(8, cores - 1) : 1;
}

const IN_WORKERS_FROM = 16 * 2 ** 20; // bytes of plan: below, a worker's start costs more than it saves
const RUN_BYTES = 8 * 2 ** 20; // about this many output bytes per run of columns: the lm head in ~19 runs

/** @typedef {{t: Int8Tensor, from: number, width: number}} ColumnRun columns [from, from + width) of weight t */

/** @param {Int8Plan} plan @returns {ColumnRun[]} */
function columnRuns(plan) {
  const runs = [];
  for (const t of plan.tensors) {
    const width = Math.max(4, Math.floor(RUN_BYTES / t.k / 4) * 4);
    for (let from = 0; from < t.n; from += width) runs.push({ t, from, width: Math.min(width, t.n - from) });
  }
  return runs;
}

// A run as a plan of its own: its columns' codes then scales, copied out of source.
/** @param {ColumnRun} run @param {Uint8Array} source */
function runJob({ t, from, width }, source) {
  const blocks = Math.ceil(t.k / t.block), codes = width * blocks * (t.block / 2), scales = width * blocks * 4;
  const bytes = new Uint8Array(codes + scales);
  bytes.set(source.subarray(t.codes[0] + from * blocks * (t.block / 2), t.codes[0] + from * blocks * (t.block / 2) + codes));
  bytes.set(source.subarray(t.scales[0] + from * blocks * 4, t.scales[0] + from * blocks * 4 + scales), codes);
  /** @type {Int8Plan} */
  const plan = { file: '', source: '', bytes: t.k * width,
    tensors: [{ codes: [0, codes], scales: [codes, scales], k: t.k, n: width, block: t.block, at: 0 }] };
  return { plan, source: bytes };
}

// A run's [K, width] rows into their columns of out.
/** @param {ColumnRun} run @param {Uint8Array} rows @param {Uint8Array} out */
function placeRun({ t, from, width }, rows, out) {
  for (let row = 0; row < t.k; row++) out.set(rows.subarray(row * width, (row + 1) * width), t.at + row * t.n + from);
}

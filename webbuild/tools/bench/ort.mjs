// What the bench drivers share: argument parsing; and for those that run graphs directly (split.mjs,
// merged.mjs) onnxruntime-web on Dawn or wasm and small tensor helpers.
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

// greedy choice over the last position, as the site's runtime makes it
export { argmaxLast } from '../../template/runtime/greedy.js';

// the pinned files a site ships, package data of webbuild (webbuild/site/ort_files.py)
export const ORT_DIST = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../site/onnxruntime-web');

/** @typedef {typeof import('onnxruntime-web')} Ort */
/**
 * The options every driver has (parseArgs); dir: the positional directory.
 * @typedef {{dir: string, ep: string, decodeTokens: number, ort: string, sessionConfig: Record<string, string>}} BenchArgs
 */

// `--name value` options over `defaults` (numbers stay numbers), plus one positional directory.
/**
 * @template {Record<string, unknown>} D
 * @param {string[]} argv
 * @param {D} defaults the driver's own options, by name
 * @param {string} usage
 * @returns {BenchArgs & D}
 */
export function parseArgs(argv, defaults, usage) {
  /** @type {Omit<BenchArgs, 'dir'> & {dir: string | null, [k: string]: unknown}} */
  const o = { dir: null, ep: 'auto', decodeTokens: 128, ort: ORT_DIST, sessionConfig: {}, ...defaults };
  /** @param {string} flag */
  const key = (flag) => flag.slice(2).replace(/-([a-z])/g, (_, c) => c.toUpperCase());
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--session-config') Object.assign(o.sessionConfig, sessionConfigEntry(argv[++i]));
    else if (a.startsWith('--') && key(a) in o) {
      const v = argv[++i];
      o[key(a)] = typeof o[key(a)] === 'number' ? Number(v) : v;
    } else if (!a.startsWith('--') && !o.dir) o.dir = path.resolve(a);
    else throw new Error(`unknown argument ${a}\nusage: ${usage}`);
  }
  if (!o.dir) throw new Error(`usage: ${usage}`);
  o.ort = path.resolve(o.ort);
  return /** @type {BenchArgs & D} */ (/** @type {unknown} */ (o)); // dir is set; D's keys came from defaults
}

// `--session-config KEY=VALUE`: an onnxruntime session config entry, e.g.
// ep.webgpuexecutionprovider.maxNumPendingDispatches=256, passed through the session options' `extra`.
/** @param {string | undefined} arg */
export function sessionConfigEntry(arg) {
  const at = arg?.indexOf('=') ?? -1;
  if (at < 1) throw new Error(`--session-config wants KEY=VALUE, got ${arg}`);
  return { [/** @type {string} */ (arg).slice(0, at)]: /** @type {string} */ (arg).slice(at + 1) }; // at >= 1: arg is there
}

// onnxruntime-web's webgpu build, on Dawn when a WebGPU adapter is there (or asked for), else wasm.
// Resolves `o.ep` ('auto' -> as the site's probe decides) and returns { ort, adapter }.
/**
 * @param {{ep: string, ort: string}} o
 * @returns {Promise<{ort: Ort, adapter: GPUAdapter | null}>}
 */
export async function openOrt(o) {
  const gpu = o.ep !== 'wasm' ? await tryDawn(o.ep) : null;
  const adapter = gpu && await gpu.requestAdapter({ powerPreference: 'high-performance' });
  if (o.ep === 'auto') o.ep = adapter ? 'webgpu' : 'wasm';
  if (o.ep === 'webgpu' && !adapter) throw new Error('no WebGPU adapter');
  return { ort: await importOrt(o.ort), adapter };
}

// WebGPU through Dawn (dawn.mjs) where the `webgpu` npm package is there: a devDependency (make setup-check),
// absent from `make site`'s install and from an installed wheel. Without it, `--ep auto` benches on wasm (a
// progress line says so) and `--ep webgpu` is an error naming how to get it. Returns the GPU, or null.
/** @param {string} ep */
export async function tryDawn(ep) {
  try {
    return (await import('./dawn.mjs')).installDawn();
  } catch (e) {
    const err = /** @type {{code?: string, message?: string}} */ (e);
    if (err.code !== 'ERR_MODULE_NOT_FOUND' || !String(err.message).includes("'webgpu'")) throw e;
    if (ep === 'webgpu') {
      throw new Error("--ep webgpu needs the `webgpu` npm package (Dawn), which webbuild's own install leaves out: "
        + 'run `make setup-check` in the webbuild checkout (npm ci with the dev packages)');
    }
    console.error("[bench] no `webgpu` npm package (Dawn) here: benching on wasm (the checkout's `make setup-check` adds it)");
    return null;
  }
}

// onnxruntime-web's webgpu build from its dist/ folder (a built site names it in runtime.json: this is
// for the harnesses that run graphs outside a site), single-threaded and quiet. In Node it reads its
// wasm binary from beside the module.
/** @returns {Promise<Ort>} */
export async function importOrt(dir = ORT_DIST) {
  /** @type {Ort} */
  const ort = await import(pathToFileURL(path.join(dir, 'ort.webgpu.min.mjs')).href);
  ort.env.wasm.numThreads = 1; // as bench.mjs: threaded glue does not load from file: URLs in Node
  ort.env.logLevel = 'error';
  return ort;
}

/**
 * @param {string} ep
 * @param {GPUAdapter | null | undefined} adapter
 */
export function adapterName(ep, adapter) {
  if (ep !== 'webgpu') return 'none (WebAssembly on the CPU)';
  /** @type {Partial<GPUAdapterInfo>} */
  const info = adapter?.info ?? {};
  return [info.vendor, info.architecture, info.device, info.description].filter(Boolean).join(' / ');
}

/** @param {string} dir @param {string} name */
export const fileBytes = (dir, name) => readFile(path.join(dir, name)).then((b) => new Uint8Array(b.buffer, b.byteOffset, b.byteLength));

// The external data files a graph may name, as onnxruntime-web wants them.
/**
 * @param {string} dir
 * @param {string[]} names
 */
export async function externalData(dir, names) {
  /** @type {{path: string, data: Uint8Array}[]} */
  const found = [];
  for (const name of names) {
    const data = await fileBytes(dir, name).catch(() => null);
    if (data) found.push({ path: name, data });
  }
  return found.length ? found : undefined;
}

/**
 * @param {Ort} ort
 * @param {number[]} values
 * @param {number[]} dims
 */
export const int64 = (ort, values, dims) => new ort.Tensor('int64', BigInt64Array.from(values, BigInt), dims);

// Disposes GPU-resident outputs (the KV cache kept on the device between steps).
/**
 * @param {import('onnxruntime-web').InferenceSession.OnnxValueMapType} outputs
 * @param {string[]} names
 */
export function disposeGpu(outputs, names) {
  for (const k of names) if (outputs[k]?.location === 'gpu-buffer') outputs[k].dispose();
}

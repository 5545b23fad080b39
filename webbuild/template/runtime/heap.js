// The wasm heap of onnxruntime-web's module: every WebAssembly.Memory an instantiation imports or
// exports, watched from the moment this module is imported (before onnxruntime-web loads its wasm): the site's
// worker imports it first, as the Node bench (tools/bench/bench.mjs) does. A wasm memory only grows, so its size
// at any point is the peak so far: what a tab must grant. The wrap passes every call through unchanged.
/** @type {Set<WebAssembly.Memory>} */
const memories = new Set();

/** @param {object | undefined} o an imports or exports object */
const scan = (o) => {
  for (const v of Object.values(o ?? {})) {
    if (v instanceof WebAssembly.Memory) memories.add(v);
    else if (v && typeof v === 'object') for (const w of Object.values(v)) if (w instanceof WebAssembly.Memory) memories.add(w);
  }
};

// the two functions wrapped as they are: their overloads' arguments and results pass through untyped
/** @typedef {Record<string, (...args: any[]) => Promise<any>>} Instantiators */
for (const name of ['instantiate', 'instantiateStreaming']) {
  const original = /** @type {Instantiators} */ (/** @type {unknown} */ (WebAssembly))[name];
  /** @type {Instantiators} */ (/** @type {unknown} */ (WebAssembly))[name] = async (...args) => {
    const r = await original.apply(WebAssembly, args);
    scan(args[1]);
    scan((r.instance ?? r).exports);
    return r;
  };
}

// Bytes of the largest wasm memory seen (0 before any instantiation).
export function wasmHeapBytes() {
  return Math.max(0, ...[...memories].map((m) => m.buffer.byteLength));
}

// The wasm heap of onnxruntime-web's module: every WebAssembly.Memory an instantiation imports or
// exports, watched from the moment this module is imported (before onnxruntime-web loads its wasm).
// A wasm memory only grows, so its size at any point is the peak so far: what a tab must grant.
const memories = new Set();

const scan = (o) => {
  for (const v of Object.values(o ?? {})) {
    if (v instanceof WebAssembly.Memory) memories.add(v);
    else if (v && typeof v === 'object') for (const w of Object.values(v)) if (w instanceof WebAssembly.Memory) memories.add(w);
  }
};

for (const name of ['instantiate', 'instantiateStreaming']) {
  const original = WebAssembly[name];
  WebAssembly[name] = async (...args) => {
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

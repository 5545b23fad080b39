"""One K x N projection of int4 block-32 weights in each form the wasm EP could run it in, timed under
Node on onnxruntime-web's wasm build (the site's own copy) at 1 and 2 threads, with each form's error
against the float32 MatMul of the int4 weight (BENCHMARKS.md "wasm kernels").

Forms: MatMulNBits at accuracy levels 0 and 4 (and 8-bit codes), the float MatMul, DynamicQuantizeMatMul
over uint8 (zero point 128: what webbuild.forms.wasm_twin's int8 form ships) and int8 weights, and
DynamicQuantizeLinear + MatMulIntegerToFloat; the 8-bit weights requantized per output column.

    python scripts/wasm_kernels.py [--k 1024] [--n 3072] [--tokens 1] [--threads 1,2] [--seconds 3]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from webbuild.graph.packing import dequantize, int8_codes
from webbuild.quantize.requantize import block_quantize
from webbuild.site.ort_files import ORT_FILES_DIR

MS = "com.microsoft"
# Node: onnxruntime-web fetches its threaded glue into a blob: URL when it deems it cross-origin, which Node
# can neither fetch (file:) nor import (blob:); the file: URL is handed straight through instead
TIMER = """
import { readFile } from 'node:fs/promises';
import { pathToFileURL } from 'node:url';
const [dir, ortDir, threads, seconds, tokens, k, ...forms] = process.argv.slice(2);
const realFetch = globalThis.fetch, realObjectURL = URL.createObjectURL;
globalThis.fetch = (u, o) => String(u).startsWith('file:') ? Promise.resolve({ blob: async () => ({ fileUrl: String(u) }) }) : realFetch(u, o);
URL.createObjectURL = (b) => b.fileUrl ?? realObjectURL(b);
const ort = await import(pathToFileURL(`${ortDir}/ort.webgpu.min.mjs`).href);
Object.assign(ort.env.wasm, { numThreads: Number(threads) });
ort.env.logLevel = 'error';
const f32 = async (name) => { const b = await readFile(`${dir}/${name}`); return new Float32Array(b.buffer, b.byteOffset, b.byteLength / 4); };
const x = new ort.Tensor('float32', await f32('x.bin'), [1, Number(tokens), Number(k)]), ref = await f32('ref.bin');
for (const form of forms) {
  const s = await ort.InferenceSession.create(await readFile(`${dir}/${form}.onnx`), { executionProviders: ['wasm'] });
  const y = (await s.run({ x })).y.data;
  let e = 0, r = 0;
  for (let i = 0; i < ref.length; i++) { e += (y[i] - ref[i]) ** 2; r += ref[i] ** 2; }
  for (let i = 0; i < 5; i++) await s.run({ x });
  const ts = [], t0 = performance.now();
  while (performance.now() - t0 < 1000 * Number(seconds) || ts.length < 10) { const t = performance.now(); await s.run({ x }); ts.push(performance.now() - t); }
  ts.sort((a, b) => a - b);
  const q = (p) => ts[Math.floor(p * (ts.length - 1))].toFixed(3);
  console.log(`| ${form} | ${threads} | ${q(0.5)} | ${q(0.1)} | ${ts.length} | ${Math.sqrt(e / r).toExponential(2)} |`);
  await s.release();
}
process.exit(0);
"""  # noqa: E501


def graphs(out: Path, k: int, n: int, tokens: int) -> list[str]:
    """Write every form's graph, the input and the float32 reference into `out`; the forms' names."""
    rng = np.random.default_rng(0)
    packed, scales = block_quantize(rng.standard_normal((k, n)).astype(np.float32) * 0.02, 4, 32)
    weight = dequantize(packed, scales, None, k, n, 4, 32)  # what every form multiplies by
    x = rng.standard_normal((1, tokens, k)).astype(np.float32)
    x.tofile(out / "x.bin")
    (x @ weight).astype(np.float32).tofile(out / "ref.bin")
    u8, col = int8_codes(packed, scales.reshape(-1), k, n, 32)
    s8 = (u8.astype(np.int16) - 128).astype(np.int8)

    def save(name: str, nodes: list, inits: list) -> str:
        io = [h.make_tensor_value_info(v, T.FLOAT, [1, tokens, d]) for v, d in (("x", k), ("y", n))]
        graph = h.make_graph(nodes, name, io[:1], io[1:], inits)
        opsets = [h.make_opsetid("", 17), h.make_opsetid(MS, 1)]
        onnx.save(h.make_model(graph, opset_imports=opsets, ir_version=9), str(out / f"{name}.onnx"))
        return name

    def nbits(name: str, bits: int, level: int) -> str:
        p, s = (packed, scales) if bits == 4 else block_quantize(weight, bits, 32)
        node = h.make_node("MatMulNBits", ["x", "B", "S"], ["y"], domain=MS, K=k, N=n, bits=bits, block_size=32,
                           accuracy_level=level)
        codes, block_scales = nh.from_array(p.reshape(n, k // 32, -1), "B"), nh.from_array(s.reshape(-1), "S")
        return save(name, [node], [codes, block_scales])

    scale = nh.from_array(col, "scale")
    return [
        nbits("matmul_nbits_level0", 4, 0), nbits("matmul_nbits_level4", 4, 4),
        nbits("matmul_nbits_8bit_level4", 8, 4),
        save("float_matmul", [h.make_node("MatMul", ["x", "W"], ["y"])], [nh.from_array(weight, "W")]),
        save("dynamic_quantize_matmul_u8", [h.make_node("DynamicQuantizeMatMul", ["x", "W", "scale", "zero"], ["y"],
                                                        domain=MS)],
             [nh.from_array(u8, "W"), scale, nh.from_array(np.array(128, np.uint8), "zero")]),
        save("dynamic_quantize_matmul_s8", [h.make_node("DynamicQuantizeMatMul", ["x", "W", "scale"], ["y"], domain=MS)],  # noqa: E501
             [nh.from_array(s8, "W"), scale]),
        save("matmul_integer_to_float_s8", [h.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
                                            h.make_node("MatMulIntegerToFloat", ["xq", "W", "xs", "scale", "xz"], ["y"],
                                                        domain=MS)],
             [nh.from_array(s8, "W"), scale]),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--n", type=int, default=3072)
    ap.add_argument("--tokens", type=int, default=1, help="rows of the activation (1: a decode step)")
    ap.add_argument("--threads", default="1,2", help="wasm threads, comma-separated")
    ap.add_argument("--seconds", type=float, default=3, help="timed runs per form and thread count")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        forms = graphs(out, a.k, a.n, a.tokens)
        (out / "timer.mjs").write_text(TIMER)
        head = "| form | threads | median ms | p10 ms | runs | error (rms, relative) |"
        print(f"{a.k} x {a.n}, {a.tokens} token(s)\n{head}\n| --- | --- | --- | --- | --- | --- |", flush=True)
        for threads in a.threads.split(","):
            subprocess.run(["node", str(out / "timer.mjs"), str(out), str(ORT_FILES_DIR), threads, str(a.seconds),
                            str(a.tokens), str(a.k), *forms], check=True)


if __name__ == "__main__":
    main()

"""Graphs of the 0.6b's adapted-decoder branches alone (28 layers, rank 32, no base weights: each projection's base
output is a graph input), for scripts/lora_down_probe.mjs: which form of the branch's down projection x @ down
([1, K] x [K, r]) onnxruntime-web runs fastest on a GPU. The branch's up stays MatMul + Add (onnxruntime fuses them
into a Gemm), as in the adapted decoder. Forms of the down:
  matmul      MatMul (the adapted decoder's form)
  gemm        Gemm
  mulreduce   Mul(x, downT [r, K]) then ReduceSum over K: every element of down read by its own thread
  grouped     x as [G, 1, 64] times down as [G, 64, r] (batched MatMul), then ones [1, G] x [G, r] (MatMul)
  nbits8      8-bit MatMulNBits, codes and scales as inputs (the adapter file's int8 layout)
and each with `_shared`: q, k and v read one down [K, 3r], gate and up one [K, 2r], their ups zero-padded rows.
    python scripts/lora_down_probe.py OUT_DIR [LAYERS]
"""
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

H, Q, KV, MLP, R = 1024, 2048, 1024, 3072, 32
OUT, L = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 28
FORMS = ["matmul", "gemm", "mulreduce", "grouped", "nbits8"]


def build(form: str, shared: bool) -> None:
    nodes, inputs, inits = [], [h.make_tensor_value_info("x", T.FLOAT, [1, H])], {}

    def const(name, arr):
        if name not in inits:
            inits[name] = numpy_helper.from_array(arr, name)
        return name

    def inp(name, dtype, dims):
        inputs.append(h.make_tensor_value_info(name, dtype, dims))
        return name

    def node(op, ins, out, **kw):
        nodes.append(h.make_node(op, ins, [out], **kw))
        return out

    def down(name, src, k, r):
        if form == "matmul":
            return node("MatMul", [src, inp(f"{name}.down", T.FLOAT, [k, r])], f"{name}.low")
        if form == "gemm":
            return node("Gemm", [src, inp(f"{name}.down", T.FLOAT, [k, r])], f"{name}.low")
        if form == "mulreduce":
            p = node("Mul", [src, inp(f"{name}.downT", T.FLOAT, [r, k])], f"{name}.prod")
            s = node("ReduceSum", [p, const("axes1", np.array([1], np.int64))], f"{name}.sum", keepdims=0)
            return node("Reshape", [s, const(f"shape_1_{r}", np.array([1, r], np.int64))], f"{name}.low")
        if form == "grouped":
            g = k // 64
            x3 = node("Reshape", [src, const(f"shape_{g}_1_64", np.array([g, 1, 64], np.int64))], f"{name}.x3")
            p = node("MatMul", [x3, inp(f"{name}.down", T.FLOAT, [g, 64, r])], f"{name}.parts")
            p2 = node("Reshape", [p, const(f"shape_{g}_{r}", np.array([g, r], np.int64))], f"{name}.parts2")
            return node("MatMul", [const(f"ones_{g}", np.ones((1, g), np.float32)), p2], f"{name}.low")
        if form == "nbits8":
            b = (k + 31) // 32
            return node("MatMulNBits", [src, inp(f"{name}.q", T.UINT8, [r, b, 32]), inp(f"{name}.s", T.FLOAT, [r * b])],
                        f"{name}.low", domain="com.microsoft", K=k, N=r, bits=8, block_size=32)
        raise ValueError(form)

    def up(name, low, r, n):
        d = node("MatMul", [low, inp(f"{name}.up", T.FLOAT, [r, n])], f"{name}.delta")
        return node("Add", [d, inp(f"{name}.base", T.FLOAT, [1, n])], f"{name}.out")

    def branches(layer, src, k, outs):  # {proj: n}: one down each, or one shared
        if shared and len(outs) > 1:
            low = down(f"{layer}.{'_'.join(outs)}", src, k, R * len(outs))
            return {p: up(f"{layer}.{p}", low, R * len(outs), n) for p, n in outs.items()}
        return {p: up(f"{layer}.{p}", down(f"{layer}.{p}", src, k, R), R, n) for p, n in outs.items()}

    x = "x"
    for i in range(L):
        a = branches(i, x, H, {"q": Q, "k": KV, "v": KV})
        o = branches(i, a["q"], Q, {"o": H})["o"]
        x2 = node("Add", [node("Add", [o, a["k"]], f"{i}.ok"), a["v"]], f"{i}.attn")
        m = branches(i, x2, H, {"gate": MLP, "up": MLP})
        x = branches(i, node("Mul", [m["gate"], m["up"]], f"{i}.gu"), MLP, {"down": H})["down"]
    nodes.append(h.make_node("Identity", [x], ["y"]))
    g = h.make_graph(nodes, form, inputs, [h.make_tensor_value_info("y", T.FLOAT, [1, H])], list(inits.values()))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)], ir_version=9)
    onnx.checker.check_model(m)
    onnx.save(m, OUT / f"lora_{form}{'_shared' if shared else ''}.onnx")


OUT.mkdir(parents=True, exist_ok=True)
for f in FORMS:
    for s in (False, True):
        build(f, s)

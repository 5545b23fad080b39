"""Graphs of the 0.6b's LoRA branches alone (28 layers x 7 projections, rank 32, no base weights), for
scripts/lora_branch_probe.mjs: which form of `x @ down @ up + residual` onnxruntime-web runs fastest on a
GPU (BENCHMARKS.md "LoRA adapters"). Three forms of one chain of ops:
  float3d  float32 MatMuls on [1, 1, H] activations, as the adapted decoder has them
  nbits3d  8-bit MatMulNBits with the codes and scales as graph inputs (the adapter file's layout)
  float2d  float32 MatMuls on [1, H]: onnxruntime's MatMul + Add fusion then takes the Adds
    python scripts/lora_branch_graphs.py OUT_DIR [LAYERS]
"""
import sys
from pathlib import Path

import onnx
from onnx import TensorProto as T
from onnx import helper as h

H, Q, KV, MLP, R = 1024, 2048, 1024, 3072, 32  # the 0.6b decoder: hidden, q, k/v, MLP width; rank
OUT, L = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 28


def build(kind, shape):
    nodes, inputs = [], [h.make_tensor_value_info("x", T.FLOAT, shape)]

    def lora(name, src, k, n):
        outs = []
        for part, (kk, nn) in (("down", (k, R)), ("up", (R, n))):
            inp = src if part == "down" else outs[-1]
            out = f"{name}.{part}.y"
            if kind == "float":
                inputs.append(h.make_tensor_value_info(f"{name}.{part}", T.FLOAT, [kk, nn]))
                nodes.append(h.make_node("MatMul", [inp, f"{name}.{part}"], [out]))
            else:
                blocks = (kk + 31) // 32
                inputs.append(h.make_tensor_value_info(f"{name}.{part}.q", T.UINT8, [nn, blocks, 32]))
                inputs.append(h.make_tensor_value_info(f"{name}.{part}.s", T.FLOAT, [nn, blocks]))
                nodes.append(h.make_node("MatMulNBits", [inp, f"{name}.{part}.q", f"{name}.{part}.s"], [out],
                                         domain="com.microsoft", K=kk, N=nn, bits=8, block_size=32))
            outs.append(out)
        return outs[-1]

    def add(a, b, out):
        nodes.append(h.make_node("Add", [a, b], [out]))
        return out

    x = "x"
    for i in range(L):
        x = add(x, lora(f"{i}.k", x, H, KV), f"{i}.hk")
        x = add(x, lora(f"{i}.v", x, H, KV), f"{i}.hv")
        t = lora(f"{i}.q", x, H, Q)
        x = add(x, lora(f"{i}.o", t, Q, H), f"{i}.ho")
        u = add(lora(f"{i}.up", x, H, MLP), lora(f"{i}.gate", x, H, MLP), f"{i}.gu")
        x = add(x, lora(f"{i}.down", u, MLP, H), f"{i}.hd")
    nodes.append(h.make_node("Identity", [x], ["y"]))
    g = h.make_graph(nodes, kind, inputs, [h.make_tensor_value_info("y", T.FLOAT, shape)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)], ir_version=9)
    onnx.save(m, OUT / f"lora_{kind}{len(shape)}d.onnx")


OUT.mkdir(parents=True, exist_ok=True)
for kind, shape in (("float", [1, 1, H]), ("nbits", [1, 1, H]), ("float", [1, H])):
    build(kind, shape)

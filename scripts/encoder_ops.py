"""Probe graphs of the ops the encoder fusion emits (SkipLayerNormalization, BiasGelu, Gelu,
MultiHeadAttention with a 104-token window mask as attention_bias; fp32 and fp16; the tiny and 0.6b
head shapes; 16 to 390 tokens) with onnxruntime CPU's outputs as the reference (fp16 graphs: the same
graph in fp32). Needs only onnx, numpy and onnxruntime, so it runs on the GPU machine too.
    python scripts/encoder_ops.py OUT_DIR
    then  node scripts/encoder_ops.mjs OUT_DIR ORT_DIST [default|nosubgroups]
"""
import json
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper
from onnx import numpy_helper as nh

out = sys.argv[1]
rng = np.random.default_rng(0)
def model(nodes, ins, outs, inits=()):
    g = helper.make_graph(nodes, "g", ins, outs, list(inits))
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(g, ir_version=8, opset_imports=opsets)
cases = {}
def add(name, m, feeds):
    cases[name] = (m, {k: np.asarray(v, np.float32) for k, v in feeds.items()})
for dt, tp in (("f32", TP.FLOAT), ("f16", TP.FLOAT16)):
    def f(n, s, tp=tp):
        return helper.make_tensor_value_info(n, tp, s)
    def w(n, a, dt=dt):
        return nh.from_array(a.astype(np.float32 if dt == "f32" else np.float16), n)
    A, H = 150, 896
    x, y = rng.standard_normal((A, H)), rng.standard_normal((A, H))
    g, b, bias = rng.standard_normal(H), rng.standard_normal(H), rng.standard_normal(H)
    sln = helper.make_node("SkipLayerNormalization", ["x", "s", "g", "b", "bias"], ["y", "", "", "sum"],
                           domain="com.microsoft", epsilon=1e-5)
    add(f"SkipLayerNormalization_{dt}",
        model([sln], [f("x", ["a", H]), f("s", ["a", H])], [f("y", ["a", H]), f("sum", ["a", H])],
              [w("g", g), w("b", b), w("bias", bias)]),
        {"x": x, "s": y})
    bias_gelu = helper.make_node("BiasGelu", ["x", "b"], ["y"], domain="com.microsoft")
    add(f"BiasGelu_{dt}", model([bias_gelu], [f("x", ["a", H])], [f("y", ["a", H])], [w("b", bias)]), {"x": x * 3})
    gelu = helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")
    add(f"Gelu_{dt}", model([gelu], [f("x", [1, 32, "a", 8])], [f("y", [1, 32, "a", 8])]),
        {"x": rng.standard_normal((1, 32, 40, 8))})
    for heads, hd in ((4, 48), (14, 64)):
        for A in (16, 31, 32, 53, 104, 150, 390):
            H = heads * hd
            win = np.arange(A) // 104
            neg = -1e9 if dt == "f32" else -65504.0
            mask = np.where(win[:, None] == win[None, :], 0.0, neg)[None, None]
            q, k, v = (rng.standard_normal((1, A, H)) for _ in range(3))
            mha = helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "", "m"], ["o"], domain="com.microsoft",
                                   num_heads=heads, scale=float(hd ** -0.5))
            add(f"MHA_{dt}_h{heads}x{hd}_A{A}",
                model([mha], [f(n, [1, "a", H]) for n in "qkv"] + [f("m", [1, 1, "a", "a"])], [f("o", [1, "a", H])]),
                {"q": q, "k": k, "v": v, "m": mask})
index = {}
for name, (m, feeds) in cases.items():
    onnx.save(m, f"{out}/{name}.onnx")
    ref = m if "_f32" in name else None
    if ref is None:  # fp16 graphs: the reference is the same graph in fp32 on the CPU
        ref = onnx.ModelProto()
        ref.CopyFrom(m)
        for vi in list(ref.graph.input) + list(ref.graph.output):
            vi.type.tensor_type.elem_type = TP.FLOAT
        for t in ref.graph.initializer:
            t.CopyFrom(nh.from_array(nh.to_array(t).astype(np.float32), t.name))
    s = ort.InferenceSession(ref.SerializeToString(), providers=["CPUExecutionProvider"])
    res = s.run(None, feeds)
    index[name] = {"dtype": "float16" if "_f16" in name else "float32",
                   "feeds": {k: {"data": v.ravel().tolist(), "dims": list(v.shape)} for k, v in feeds.items()},
                   "expected": {o.name: r.ravel().tolist() for o, r in zip(s.get_outputs(), res)}}
with open(f"{out}/index.json", "w") as fh:
    json.dump(index, fh)
print(len(index), "cases")

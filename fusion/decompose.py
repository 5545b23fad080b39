"""The inverse of the fusion rules, for round-trip tests: fuse(decompose(g)) ~ g.

GroupQueryAttention -> reshape/transpose, rotate_half RoPE from the cos/sin caches gathered by
position, Concat with the past, repeat_kv, scaled scores + causal mask, Softmax, MatMul;
SkipSimplifiedLayerNormalization -> Add + RMSNorm; SimplifiedLayerNormalization -> the dynamo
spelling of RMSNorm (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul).
Limits: the decomposed attention masks causally only (seqlens_k padding is not reproduced),
positions start at the past length, as for unpadded batches.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from fusion._ir import attr, dead_code_elimination, replace, shared_const

_NEG = -1e9


class _Builder:
    """Collects new nodes; `op` returns the (first) output value."""

    def __init__(self, graph: ir.Graph, prefix: str):
        self.graph, self.prefix, self.nodes = graph, prefix, []

    def op(self, op_type: str, *inputs, outputs: int = 1, **attrs):
        n = ir.node(op_type, list(inputs), attrs or None, num_outputs=outputs,
                    name=f"{self.prefix}/{op_type}_{len(self.nodes)}")
        self.nodes.append(n)
        return n.outputs[0] if outputs == 1 else n.outputs

    def const(self, name: str, array) -> ir.Value:
        return shared_const(self.graph, f"decomposed/{name}", np.asarray(array))


def decompose(model: ir.Model) -> dict[str, int]:
    """Rewrite every fused node of `model` into primitives; returns op -> nodes decomposed."""
    done: dict[str, int] = {}
    for op, fn in (("GroupQueryAttention", _gqa), ("SkipSimplifiedLayerNormalization", _skip),
                   ("SimplifiedLayerNormalization", _sln)):
        for node in [n for n in model.graph if n.op_type == op]:
            b = _Builder(model.graph, node.name or op)
            new_outputs = fn(b, node)
            model.graph.insert_before(node, b.nodes)
            for old, new in zip(node.outputs, new_outputs):
                if new is not None:
                    new.type, new.shape = old.type, old.shape
                    replace(old, new)
            done[op] = done.get(op, 0) + 1
        dead_code_elimination(model)
    return done


def _rms(b: _Builder, x: ir.Value, w: ir.Value, eps: float) -> ir.Value:
    sq = b.op("Pow", x, b.const("two", np.float32(2)))
    if b.graph.opset_imports.get("", 18) >= 18:
        mean = b.op("ReduceMean", sq, b.const("axes_last", [-1]), keepdims=1)
    else:  # axes became an input in opset 18
        mean = b.op("ReduceMean", sq, axes=[-1], keepdims=1)
    inv = b.op("Reciprocal", b.op("Sqrt", b.op("Add", mean, b.const(f"eps_{eps:g}", np.float32(eps)))))
    return b.op("Mul", w, b.op("Mul", x, inv))


def _sln(b: _Builder, n: ir.Node) -> list:
    return [_rms(b, n.inputs[0], n.inputs[1], attr(n, "epsilon", 1e-5))]


def _skip(b: _Builder, n: ir.Node) -> list:
    total = b.op("Add", n.inputs[0], n.inputs[1])
    return [_rms(b, total, n.inputs[2], attr(n, "epsilon", 1e-5)), None, None, total]


def _gqa(b: _Builder, n: ir.Node) -> list:
    heads, kv = int(attr(n, "num_heads")), int(attr(n, "kv_num_heads"))
    cos_cache, sin_cache = (n.inputs[i].const_value.numpy() for i in (7, 8))
    hd = cos_cache.shape[1] * 2
    q, k, v = n.inputs[0], n.inputs[1], n.inputs[2]
    if k is None:  # packed QKV
        q, k, v = b.op("Split", q, b.const(f"qkv_{heads}_{kv}_{hd}", [heads * hd, kv * hd, kv * hd]), outputs=3, axis=-1)
    norms = [n.inputs[i] if len(n.inputs) > i else None for i in (14, 15)]
    eps = attr(n, "qk_norm_epsilon", 1e-6)
    past_k, past_v = n.inputs[3], n.inputs[4]
    past_len = (b.op("Shape", past_k, start=2, end=3) if past_k is not None else b.const("zero_1d", [0]))
    seq_len = b.op("Shape", q, start=1, end=2)
    pos = b.op("Range", b.op("Squeeze", past_len), b.op("Squeeze", b.op("Add", past_len, seq_len)), b.const("one", np.int64(1)))
    cos = _table(b, "cos", cos_cache, pos)
    sin = _table(b, "sin", sin_cache, pos)
    qt = _rope(b, _to_heads(b, q, heads, hd, norms[0], eps), cos, sin, hd)
    kt = _rope(b, _to_heads(b, k, kv, hd, norms[1], eps), cos, sin, hd)
    vt = _to_heads(b, v, kv, hd, None, eps)
    k_all = b.op("Concat", past_k, kt, axis=2) if past_k is not None else kt
    v_all = b.op("Concat", past_v, vt, axis=2) if past_v is not None else vt
    scores = b.op("Mul", b.op("MatMul", qt, b.op("Transpose", _repeat(b, k_all, heads, kv, hd), perm=[0, 1, 3, 2])),
                  b.const(f"scale_{attr(n, 'scale'):g}", np.float32(attr(n, "scale"))))
    k_pos = b.op("Range", b.const("zero", np.int64(0)), b.op("Squeeze", b.op("Add", past_len, seq_len)), b.const("one", np.int64(1)))
    causal = b.op("LessOrEqual", k_pos, b.op("Unsqueeze", pos, b.const("axes_last", [-1])))
    mask = b.op("Where", causal, b.const("zero_f", np.float32(0)), b.const("neg", np.float32(_NEG)))
    probs = b.op("Softmax", b.op("Add", scores, mask), axis=-1)
    out = b.op("MatMul", probs, _repeat(b, v_all, heads, kv, hd))
    out = b.op("Reshape", b.op("Transpose", out, perm=[0, 2, 1, 3]), b.const("shape_bs_flat", [0, 0, -1]))
    return [out, k_all, v_all]


def _table(b: _Builder, name: str, cache: np.ndarray, pos: ir.Value) -> ir.Value:
    full = np.concatenate([cache, cache], axis=1)  # rotate_half pairs dim i with i + hd/2
    rows = b.op("Gather", b.const(f"{name}_table_{full.shape[0]}x{full.shape[1]}", full), pos, axis=0)
    return b.op("Unsqueeze", rows, b.const("axes_01", [0, 1]))


def _to_heads(b: _Builder, x, heads: int, hd: int, norm_w, eps: float) -> ir.Value:
    x = b.op("Reshape", x, b.const(f"shape_heads_{heads}_{hd}", [0, 0, heads, hd]))
    if norm_w is not None:
        x = _rms(b, x, norm_w, eps)
    return b.op("Transpose", x, perm=[0, 2, 1, 3])


def _rope(b: _Builder, x, cos, sin, hd: int) -> ir.Value:
    half, axis = b.const(f"half_{hd}", [hd // 2]), b.const("axis_3", [3])
    lo = b.op("Slice", x, b.const("zero_1d", [0]), half, axis)
    hi = b.op("Slice", x, half, b.const(f"end_{hd}", [hd]), axis)
    rotated = b.op("Concat", b.op("Neg", hi), lo, axis=-1)
    return b.op("Add", b.op("Mul", x, cos), b.op("Mul", rotated, sin))


def _repeat(b: _Builder, x, heads: int, kv: int, hd: int) -> ir.Value:
    if heads == kv:
        return x
    wide = b.op("Expand", b.op("Unsqueeze", x, b.const("axes_2", [2])), b.const(f"groups_{heads // kv}", [1, 1, heads // kv, 1, 1]))
    return b.op("Reshape", wide, b.const(f"shape_rep_{heads}_{hd}", [0, heads, -1, hd]))

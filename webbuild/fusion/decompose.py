"""The inverse of the fusion rules, for round-trip tests: fuse(decompose(g)) ~ g.

GroupQueryAttention -> reshape/transpose, rotate_half RoPE from the cos/sin caches gathered by
position, Concat with the past, repeat_kv, scaled scores + causal mask, Softmax, MatMul;
SkipSimplifiedLayerNormalization -> Add + RMSNorm; SimplifiedLayerNormalization -> the dynamo
spelling of RMSNorm (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul); 4-bit MatMulNBits ->
blocked DequantizeLinear (uint4, opset 21; the graph's opset is raised when its ops allow) + MatMul.
Limits: the decomposed attention masks causally only (seqlens_k padding is not reproduced),
positions start at the past length, as for unpadded batches.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir

from webbuild.fusion.dequant import ACCURACY_KEY
from webbuild.fusion.qk_norm_in_gqa import head_norm
from webbuild.graph.ir import attr, const, dead_code_elimination, new_const, replace, shared_const

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
    if any(n.op_type == "MatMulNBits" for n in model.graph):
        _raise_opset(model, 21)
    for op, fn in (("GroupQueryAttention", _gqa), ("SkipSimplifiedLayerNormalization", _skip),
                   ("SimplifiedLayerNormalization", _sln), ("MatMulNBits", _matmul_nbits)):
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
        q, k, v = b.op("Split", q, b.const(f"qkv_{heads}_{kv}_{hd}", [heads * hd, kv * hd, kv * hd]),
                       outputs=3, axis=-1)
    norms = [n.inputs[i] if len(n.inputs) > i else None for i in (14, 15)]
    eps = attr(n, "qk_norm_epsilon", 1e-6)
    past_k, past_v = n.inputs[3], n.inputs[4]
    past_len = (b.op("Shape", past_k, start=2, end=3) if past_k is not None else b.const("zero_1d", [0]))
    seq_len = b.op("Shape", q, start=1, end=2)
    pos = b.op("Range", b.op("Squeeze", past_len), b.op("Squeeze", b.op("Add", past_len, seq_len)),
               b.const("one", np.int64(1)))
    cos = _table(b, "cos", cos_cache, pos)
    sin = _table(b, "sin", sin_cache, pos)
    qt = _rope(b, _to_heads(b, q, heads, hd, norms[0], eps), cos, sin, hd)
    kt = _rope(b, _to_heads(b, k, kv, hd, norms[1], eps), cos, sin, hd)
    vt = _to_heads(b, v, kv, hd, None, eps)
    k_all = b.op("Concat", past_k, kt, axis=2) if past_k is not None else kt
    v_all = b.op("Concat", past_v, vt, axis=2) if past_v is not None else vt
    scores = b.op("Mul", b.op("MatMul", qt, b.op("Transpose", _repeat(b, k_all, heads, kv, hd), perm=[0, 1, 3, 2])),
                  b.const(f"scale_{attr(n, 'scale'):g}", np.float32(attr(n, "scale"))))
    k_pos = b.op("Range", b.const("zero", np.int64(0)), b.op("Squeeze", b.op("Add", past_len, seq_len)),
                 b.const("one", np.int64(1)))
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
    normed = head_norm(x)
    if normed is not None:  # an explicit head-wise norm flattened for GQA: use its 4-D output as is
        return b.op("Transpose", normed[1].outputs[0], perm=[0, 2, 1, 3])
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
    wide = b.op("Expand", b.op("Unsqueeze", x, b.const("axes_2", [2])),
                b.const(f"groups_{heads // kv}", [1, 1, heads // kv, 1, 1]))
    return b.op("Reshape", wide, b.const(f"shape_rep_{heads}_{hd}", [0, heads, -1, hd]))


def _raise_opset(model: ir.Model, target: int) -> None:
    """Blocked DequantizeLinear needs opset 21; refuse when an op's inputs/attributes changed since."""
    current = model.graph.opset_imports.get("", 1)
    if current >= target:
        return
    for n in model.graph:
        if n.domain != "" or not onnx.defs.has(n.op_type):
            continue
        old, new = onnx.defs.get_schema(n.op_type, current), onnx.defs.get_schema(n.op_type, target)
        added = set(new.attributes) - set(old.attributes)
        if ([i.name for i in old.inputs] != [i.name for i in new.inputs]
                or not set(old.attributes) <= set(new.attributes)
                or any(new.attributes[a].required for a in added)):
            raise ValueError(f"{n.op_type} changed between opset {current} and {target}; cannot decompose MatMulNBits")
    model.graph.opset_imports[""] = target


def _unpack_pairs(packed: np.ndarray, count: int) -> np.ndarray:
    """bytes along the last axis -> 4-bit values (low nibble first), the first `count` of them."""
    out = np.stack([packed & 15, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)
    return out[..., :count]


def _matmul_nbits(b: _Builder, n: ir.Node) -> list:
    k, width, bs = int(attr(n, "K")), int(attr(n, "N")), int(attr(n, "block_size"))
    if attr(n, "bits", 4) != 4 or any(x is not None for x in n.inputs[4:]):
        raise ValueError(f"{n.name}: only 4-bit MatMulNBits without g_idx/bias decompose")
    blocks = -(-k // bs)
    q = _unpack_pairs(const(n.inputs[1]).reshape(width, blocks, bs // 2), bs).reshape(width, -1)[:, :k]
    scales = const(n.inputs[2]).reshape(width, blocks)
    zp = const(n.inputs[3]) if len(n.inputs) > 3 and n.inputs[3] is not None else None
    if zp is not None and zp.dtype != np.uint8:
        raise ValueError(f"{n.name}: float zero points do not decompose to DequantizeLinear")
    zero = _unpack_pairs(zp.reshape(width, -1), blocks) if zp is not None else np.full((width, blocks), 8, np.uint8)
    g, name = b.graph, n.name or "MatMulNBits"
    inputs = [new_const(g, f"{name}.q", np.ascontiguousarray(q.T).astype(ml_dtypes.uint4)),
              new_const(g, f"{name}.scale", np.ascontiguousarray(scales.T)),
              new_const(g, f"{name}.zero_point", np.ascontiguousarray(zero.T).astype(ml_dtypes.uint4))]
    weight = b.op("DequantizeLinear", *inputs, axis=0, block_size=bs)
    b.nodes[-1].metadata_props[ACCURACY_KEY] = str(attr(n, "accuracy_level", 0))
    return [b.op("MatMul", n.inputs[0], weight)]

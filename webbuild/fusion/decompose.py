"""The inverse of the fusion rules, for round-trip tests: fuse(decompose(g)) ~ g.

GroupQueryAttention -> reshape/transpose, rotate_half RoPE from the cos/sin caches gathered by
position, Concat with the past, repeat_kv, scaled scores + causal mask, Softmax, MatMul;
SkipSimplifiedLayerNormalization -> Add + RMSNorm; SimplifiedLayerNormalization -> the dynamo
spelling of RMSNorm (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul); 4- and 8-bit MatMulNBits ->
blocked DequantizeLinear (opset 21; the graph's opset is raised when its ops allow) + MatMul, or the
WebNN EP's Cast / Sub / Mul + Reshape + Transpose + MatMul; GatherBlockQuantized ->
DequantizeLinear(table) + Gather, an lm_head MatMulNBits reading the same bytes -> Transpose of that
table + MatMul (the tied spelling). Codes are uint4/uint8 with zero points, or int4/int8 (`signed`).
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
from webbuild.graph.builder import Builder
from webbuild.graph.ir import (
    attr,
    const,
    const_input,
    dead_code_elimination,
    new_const,
    only_user,
    prod,
    replace,
)
from webbuild.graph.packing import LOOKUP_ATTRS, unpack_codes

_NEG = -1e9


class _Builder(Builder):
    """The primitives of one fused node: nodes `<fused node>/<op>_<n>`, constants `decomposed/<name>` shared by
    the whole graph, and the decomposition's options."""

    def __init__(self, graph: ir.Graph, prefix: str, weights: str = "dq", signed: bool = False,
                 tables: dict | None = None):
        super().__init__(graph, f"{prefix}/", const_prefix="decomposed/")
        self.weights, self.signed = weights, signed
        # a lookup's data -> (bits, block size, scales' source, zero points, its DequantizeLinear table)
        self.tables = {} if tables is None else tables


def decompose(model: ir.Model, weights: str = "dq", signed: bool = False) -> dict[str, int]:
    """Rewrite every fused node of `model` into primitives; returns op -> nodes decomposed.

    weights: the spelling of MatMulNBits' weight, "dq" (DequantizeLinear [K, N] blocked along K) or
    "cast" (Cast / Sub / Mul of [N, blocks, bs], Reshape, Transpose: the WebNN EP's); signed: int4/int8
    codes (no zero point where the contrib op had its default) instead of uint4/uint8."""
    if weights not in ("dq", "cast"):
        raise ValueError(f"weights must be 'dq' or 'cast', not {weights!r}")
    done: dict[str, int] = {}
    tables: dict = {}
    if any(n.op_type in ("MatMulNBits", "GatherBlockQuantized") for n in model.graph):
        _raise_opset(model, 21)
    for op, fn in (("GroupQueryAttention", _gqa), ("SkipSimplifiedLayerNormalization", _skip),
                   ("SimplifiedLayerNormalization", _sln), ("GatherBlockQuantized", _gbq),
                   ("MatMulNBits", _matmul_nbits)):
        for node in [n for n in model.graph if n.op_type == op]:
            b = _Builder(model.graph, node.name or op, weights, signed, tables)
            new_outputs = fn(b, node)
            model.graph.insert_before(node, b.nodes)
            pairs = new_outputs.items() if isinstance(new_outputs, dict) else zip(node.outputs, new_outputs)
            for old, new in pairs:
                if new is not None:
                    new.type, new.shape = old.type, old.shape
                    replace(old, new)
            done[op] = done.get(op, 0) + 1
        dead_code_elimination(model)
    return done


def _rms(b: _Builder, x: ir.Value | None, w: ir.Value | None, eps: float) -> ir.Value:
    sq = b.op("Pow", [x, b.const("two", np.float32(2))])
    if b.graph.opset_imports.get("", 18) >= 18:
        mean = b.op("ReduceMean", [sq, b.const("axes_last", [-1])], keepdims=1)
    else:  # axes became an input in opset 18
        mean = b.op("ReduceMean", [sq], axes=[-1], keepdims=1)
    inv = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [mean, b.const(f"eps_{eps:g}", np.float32(eps))])])])
    return b.op("Mul", [w, b.op("Mul", [x, inv])])


def _sln(b: _Builder, n: ir.Node) -> list:
    return [_rms(b, n.inputs[0], n.inputs[1], attr(n, "epsilon", 1e-5))]


def _skip(b: _Builder, n: ir.Node) -> list:
    total = b.op("Add", [n.inputs[0], n.inputs[1]])
    return [_rms(b, total, n.inputs[2], attr(n, "epsilon", 1e-5)), None, None, total]


def _gqa(b: _Builder, n: ir.Node) -> list:
    heads, kv = int(attr(n, "num_heads")), int(attr(n, "kv_num_heads"))
    cos_cache, sin_cache = (const_input(n, i) for i in (7, 8))
    hd = cos_cache.shape[1] * 2
    q, k, v = n.inputs[0], n.inputs[1], n.inputs[2]
    if k is None:  # packed QKV
        q, k, v = b.node("Split", [q, b.const(f"qkv_{heads}_{kv}_{hd}", [heads * hd, kv * hd, kv * hd])],
                         outputs=3, axis=-1).outputs
    norms = [n.inputs[i] if len(n.inputs) > i else None for i in (14, 15)]
    eps = attr(n, "qk_norm_epsilon", 1e-6)
    past_k, past_v = n.inputs[3], n.inputs[4]
    past_len = (b.op("Shape", [past_k], start=2, end=3) if past_k is not None else b.const("zero_1d", [0]))
    seq_len = b.op("Shape", [q], start=1, end=2)
    pos = b.op("Range", [b.op("Squeeze", [past_len]), b.op("Squeeze", [b.op("Add", [past_len, seq_len])]),
                         b.const("one", np.int64(1))])
    cos = _table(b, "cos", cos_cache, pos)
    sin = _table(b, "sin", sin_cache, pos)
    qt = _rope(b, _to_heads(b, q, heads, hd, norms[0], eps), cos, sin, hd)
    kt = _rope(b, _to_heads(b, k, kv, hd, norms[1], eps), cos, sin, hd)
    vt = _to_heads(b, v, kv, hd, None, eps)
    k_all = b.op("Concat", [past_k, kt], axis=2) if past_k is not None else kt
    v_all = b.op("Concat", [past_v, vt], axis=2) if past_v is not None else vt
    keys_t = b.op("Transpose", [_repeat(b, k_all, heads, kv, hd)], perm=[0, 1, 3, 2])
    scores = b.op("Mul", [b.op("MatMul", [qt, keys_t]),
                          b.const(f"scale_{attr(n, 'scale'):g}", np.float32(attr(n, "scale")))])
    k_pos = b.op("Range", [b.const("zero", np.int64(0)), b.op("Squeeze", [b.op("Add", [past_len, seq_len])]),
                           b.const("one", np.int64(1))])
    causal = b.op("LessOrEqual", [k_pos, b.op("Unsqueeze", [pos, b.const("axes_last", [-1])])])
    mask = b.op("Where", [causal, b.const("zero_f", np.float32(0)), b.const("neg", np.float32(_NEG))])
    probs = b.op("Softmax", [b.op("Add", [scores, mask])], axis=-1)
    out = b.op("MatMul", [probs, _repeat(b, v_all, heads, kv, hd)])
    out = b.op("Reshape", [b.op("Transpose", [out], perm=[0, 2, 1, 3]), b.const("shape_bs_flat", [0, 0, -1])])
    return [out, k_all, v_all]


def _table(b: _Builder, name: str, cache: np.ndarray, pos: ir.Value) -> ir.Value:
    full = np.concatenate([cache, cache], axis=1)  # rotate_half pairs dim i with i + hd/2
    rows = b.op("Gather", [b.const(f"{name}_table_{full.shape[0]}x{full.shape[1]}", full), pos], axis=0)
    return b.op("Unsqueeze", [rows, b.const("axes_01", [0, 1])])


def _to_heads(b: _Builder, x, heads: int, hd: int, norm_w, eps: float) -> ir.Value:
    normed = head_norm(x)
    if normed is not None:  # an explicit head-wise norm flattened for GQA: use its 4-D output as is
        return b.op("Transpose", [normed[1].outputs[0]], perm=[0, 2, 1, 3])
    x = b.op("Reshape", [x, b.const(f"shape_heads_{heads}_{hd}", [0, 0, heads, hd])])
    if norm_w is not None:
        x = _rms(b, x, norm_w, eps)
    return b.op("Transpose", [x], perm=[0, 2, 1, 3])


def _rope(b: _Builder, x, cos, sin, hd: int) -> ir.Value:
    half, axis = b.const(f"half_{hd}", [hd // 2]), b.const("axis_3", [3])
    lo = b.op("Slice", [x, b.const("zero_1d", [0]), half, axis])
    hi = b.op("Slice", [x, half, b.const(f"end_{hd}", [hd]), axis])
    rotated = b.op("Concat", [b.op("Neg", [hi]), lo], axis=-1)
    return b.op("Add", [b.op("Mul", [x, cos]), b.op("Mul", [rotated, sin])])


def _repeat(b: _Builder, x, heads: int, kv: int, hd: int) -> ir.Value:
    if heads == kv:
        return x
    wide = b.op("Expand", [b.op("Unsqueeze", [x, b.const("axes_2", [2])]),
                           b.const(f"groups_{heads // kv}", [1, 1, heads // kv, 1, 1])])
    return b.op("Reshape", [wide, b.const(f"shape_rep_{heads}_{hd}", [0, heads, -1, hd])])


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


_CODES = {(4, False): ml_dtypes.uint4, (4, True): ml_dtypes.int4, (8, False): np.uint8, (8, True): np.int8}


def _stored(b: _Builder, codes: np.ndarray, zero: np.ndarray | None, bits: int,
            shape: tuple) -> tuple[np.ndarray, np.ndarray | None]:
    """Unsigned codes and zero points (None: the contrib ops' default 2^(bits-1)) as DequantizeLinear's
    q and zero point: uint4/uint8 with explicit zero points, or int4/int8 shifted (`b.signed`), whose
    default zero point 0 is that same default. `shape`: the zero points' (the scales')."""
    dtype, shift = _CODES[bits, b.signed], 2 ** (bits - 1)
    if not b.signed:
        return codes.astype(dtype), _full_zero(zero, bits, shape).astype(dtype)
    q = (codes.astype(np.int16) - shift).astype(dtype)
    return q, None if zero is None or np.all(zero == shift) else (zero.astype(np.int16) - shift).astype(dtype)


def _full_zero(zero: np.ndarray | None, bits: int, shape: tuple) -> np.ndarray:
    return np.full(shape, 2 ** (bits - 1)) if zero is None else zero


def _dq(b: _Builder, name: str, q: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, axis: int, bs: int,
        level: int) -> ir.Value:
    g = b.graph
    inputs = [new_const(g, f"{name}.q", np.ascontiguousarray(q)),
              new_const(g, f"{name}.scale", np.ascontiguousarray(scale))]
    if zero is not None:
        inputs.append(new_const(g, f"{name}.zero_point", np.ascontiguousarray(zero)))
    out = b.op("DequantizeLinear", inputs, axis=axis, block_size=bs)
    b.nodes[-1].metadata_props[ACCURACY_KEY] = str(level)
    return out


def _source(v: ir.Value | None) -> tuple[ir.Value | None, np.ndarray]:
    """A constant input, or the constant a Reshape of it reads (a lookup's scales shared with lm_head)."""
    r = prod(v, "Reshape")
    src = r.inputs[0] if r is not None and const(v) is None else v
    c = const(src)
    if c is None:
        raise ValueError(f"{v.name if v is not None else 'an absent input'}: scales that are not a constant")
    return src, c


def _gbq(b: _Builder, n: ir.Node):
    """GatherBlockQuantized in webbuild.graph.packing's layout -> DequantizeLinear(table [V, H], axis 1)
    -> Gather; the Reshape of [..., H/bs, bs] to [..., H] behind it goes too."""
    bits, bs = int(attr(n, "bits", 4)), int(attr(n, "block_size", 128))
    data = const(n.inputs[0])
    if (data is None or data.dtype != np.uint8 or data.ndim != 3
            or {k: attr(n, k, 0 if k == "gather_axis" else 1) for k in LOOKUP_ATTRS} != LOOKUP_ATTRS):
        raise ValueError(f"{n.name}: only lookups laid out as webbuild.graph.packing's LOOKUP_ATTRS decompose")
    rows, blocks = data.shape[:2]
    codes = unpack_codes(data, bits, rows)
    scale_src, scale = _source(n.inputs[2])
    scale = scale.reshape(rows, blocks)
    zp = const(n.inputs[3]) if len(n.inputs) > 3 and n.inputs[3] is not None else None
    zero = None if zp is None else zp.reshape(rows, blocks) & (15 if bits == 4 else 255)
    b.tables[n.inputs[0]] = (bits, bs, scale_src, _full_zero(zero, bits, scale.shape))
    q, zero = _stored(b, codes, zero, bits, scale.shape)
    table = _dq(b, n.name or "GatherBlockQuantized", q, scale, zero, 1, bs, 0)
    b.tables[n.inputs[0]] += (table,)
    rows_out = b.op("Gather", [table, n.inputs[1]], axis=0)
    after = only_user(n.outputs[0], "Reshape")
    rank = len(n.inputs[1].shape) if n.inputs[1] is not None and n.inputs[1].shape is not None else -1
    target = const(after.inputs[1]) if after is not None else None
    if after is not None and target is not None and target.tolist() == [0] * rank + [codes.shape[1]]:
        return {after.outputs[0]: rows_out}
    return [b.op("Reshape", [rows_out, b.const(f"shape_blocks_{rank}_{blocks}_{bs}", [0] * rank + [blocks, bs])])]


def _matmul_nbits(b: _Builder, n: ir.Node) -> list:
    k, width, bs, bits = int(attr(n, "K")), int(attr(n, "N")), int(attr(n, "block_size")), int(attr(n, "bits", 4))
    if bits not in (4, 8) or any(x is not None for x in n.inputs[4:]):
        raise ValueError(f"{n.name}: only 4- and 8-bit MatMulNBits without g_idx/bias decompose")
    level = int(attr(n, "accuracy_level", 0))
    blocks = -(-k // bs)
    scales = const_input(n, 2).reshape(width, blocks)
    zp = const(n.inputs[3]) if len(n.inputs) > 3 and n.inputs[3] is not None else None
    if zp is not None and zp.dtype != np.uint8:
        raise ValueError(f"{n.name}: float zero points do not decompose to DequantizeLinear")
    zero = unpack_codes(zp, bits, width)[:, :blocks] if zp is not None else None
    tied = b.tables.get(n.inputs[1])
    if tied is not None and tied[:3] == (bits, bs, n.inputs[2]) and np.array_equal(
            tied[3], _full_zero(zero, bits, scales.shape)):  # lm_head reads the lookup's table: its transpose
        tied[4].producer().metadata_props[ACCURACY_KEY] = str(level)  # the lookup has no accuracy level
        return [b.op("MatMul", [n.inputs[0], b.op("Transpose", [tied[4]], perm=[1, 0])])]
    codes = unpack_codes(const_input(n, 1), bits, width)  # [N, blocks * bs]
    name = n.name or "MatMulNBits"
    if b.weights == "cast":  # Cast(q [N, blocks, bs]) [- zero point] * scale -> [N, K] -> transposed
        if k % bs:
            raise ValueError(f"{name}: K={k} is not a multiple of block_size={bs}; the Cast spelling has no padding")
        q, zq = _stored(b, codes.reshape(width, blocks, bs), None if zero is None else zero[..., None], bits,
                        (width, blocks, 1))
        x = b.op("Cast", [new_const(b.graph, f"{name}.q", q)], to=ir.DataType.from_numpy(scales.dtype))
        b.nodes[-1].metadata_props[ACCURACY_KEY] = str(level)
        if zq is not None:
            x = b.op("Sub", [x, new_const(b.graph, f"{name}.zero_point", zq.astype(scales.dtype))])
        x = b.op("Mul", [x, new_const(b.graph, f"{name}.scale", scales[..., None])])
        w = b.op("Reshape", [x, b.const(f"shape_{width}_{k}", [width, k])])
        return [b.op("MatMul", [n.inputs[0], b.op("Transpose", [w], perm=[1, 0])])]
    # W [K, N], blocked along K
    q, zq = _stored(b, codes[:, :k].T, None if zero is None else zero.T, bits, (blocks, width))
    return [b.op("MatMul", [n.inputs[0], _dq(b, name, q, scales.T, zq, 0, bs, level)])]

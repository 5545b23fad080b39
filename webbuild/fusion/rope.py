"""Rotary embedding: recognise RoPE (rotate_half, or interleaved pairs) and rebuild its cos/sin tables
as GQA caches.

The source computes cos/sin from position ids at run time (Cos/Sin of positions x inv_freq, times
an attention scaling). GroupQueryAttention wants them precomputed per position: [max_pos, hd/2].
inv_freq and the scaling are read from the graph's constants, so rope_theta and scaled variants
(linear, llama3, yarn: all fold into inv_freq / scaling) need no config.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from webbuild.graph.ir import attr, axes_of, const, other, prod, scalar_operand

_INT64_MAX = 2**63 - 1


@dataclass
class Rope:
    x: ir.Value    # the tensor being rotated, [B, heads, S, hd]
    cos: ir.Value  # as multiplied in, e.g. Unsqueeze(cos, 1)
    sin: ir.Value
    interleaved: bool = False  # pairs (x0, x1), (x2, x3), ... rotate, rather than the two halves
    partial: bool = False  # only the first dims of the head rotate: `dims` of them (None: as many as the
    dims: int | None = None  # frequencies, when the split point is computed from the tables' shape)
    half: bool = False  # cos/sin hold one entry per frequency (opset 23's RotaryEmbedding), not two


def match(v: ir.Value | None) -> Rope | None:
    """v = x*cos + rotate(x)*sin (any operand order), rotate being rotate_half or the interleaved pair
    rotation; also Concat(rope(x[..., :d]), x[..., d:]) with d read from cos (Phi-3's partial-rotary
    spelling): that is rope(x) when d is the whole head, which the caches' size check settles."""
    standard = prod(v, "RotaryEmbedding")
    if standard is not None and standard.domain in ("", "ai.onnx"):
        return _standard(standard)
    whole = _split_rotary(v)
    if whole is not None:
        r = match(whole[0])
        return (Rope(whole[1], r.cos, r.sin, r.interleaved, True, whole[3], r.half)
                if r is not None and r.x is whole[2] else None)
    add = prod(v, "Add")
    if add is None:
        return None
    for m1, m2 in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        a, b = prod(m1, "Mul"), prod(m2, "Mul")
        if a is None or b is None:
            continue
        for x in a.inputs:
            for rot in b.inputs:
                cos, sin = other(a, x), other(b, rot)
                if x is None or cos is None or sin is None:
                    continue
                if _is_rotate_half(rot, x):
                    return Rope(x, cos, sin)
                if _is_rotate_pairs(rot, x):
                    return Rope(x, cos, sin, interleaved=True)
    return None


def _standard(n: ir.Node) -> Rope | None:
    """opset 23's RotaryEmbedding(x [B, heads, S, hd], cos, sin) with cos/sin [B, S, rotary/2] per position
    (no position_ids: the form torch.onnx's dynamo export writes)."""
    x, cos, sin = (*n.inputs, None, None, None)[:3]
    if x is None or cos is None or sin is None or (len(n.inputs) > 3 and n.inputs[3] is not None):
        return None
    dims = attr(n, "rotary_embedding_dim", 0)
    return Rope(x, cos, sin, bool(attr(n, "interleaved", 0)), bool(dims), dims or None, half=True)


def _split_rotary(v: ir.Value | None) -> tuple[ir.Value, ir.Value, ir.Value, int | None] | None:
    """v = Concat(y, x[..., d:], axis=-1) with y computed from x[..., :d]: (y, x, x[..., :d], d when constant)."""
    cat = prod(v, "Concat")
    if cat is None or len(cat.inputs) != 2 or attr(cat, "axis") not in (-1, 3):
        return None
    rest = prod(cat.inputs[1], "Slice")
    if rest is None or _slice_axis(rest) not in (-1, 3) or _const_at(rest, 2) not in (None, _INT64_MAX):
        return None
    x, y = rest.inputs[0], cat.inputs[0]
    if x is None or y is None:
        return None
    head = next((u for u in x.consumers() if u is not rest and u.op_type == "Slice"
                 and _slice_axis(u) in (-1, 3) and _const_at(u, 1) == 0 and u.inputs[2] is rest.inputs[1]), None)
    return (y, x, head.outputs[0], _const_at(rest, 1)) if head is not None else None


def _slice_axis(s: ir.Node) -> int | None:
    return _const_at(s, 3)


def _const_at(n: ir.Node, i: int) -> int | None:
    c = const(n.inputs[i]) if len(n.inputs) > i and n.inputs[i] is not None else None
    return int(c.reshape(-1)[0]) if c is not None and c.size == 1 else None


def _is_rotate_half(r: ir.Value | None, x: ir.Value) -> bool:
    """r = Concat(-x[..., h:], x[..., :h], axis=-1)."""
    cat = prod(r, "Concat")
    if cat is None or len(cat.inputs) != 2 or attr(cat, "axis") not in (-1, 3):
        return False
    neg = prod(cat.inputs[0], "Neg")
    hi = prod(neg.inputs[0], "Slice") if neg else None
    lo = prod(cat.inputs[1], "Slice")
    return bool(hi and lo and hi.inputs[0] is x and lo.inputs[0] is x)


def _is_rotate_pairs(r: ir.Value | None, x: ir.Value) -> bool:
    """r = Reshape(Concat(Unsqueeze(-x[..., 1::2], -1), Unsqueeze(x[..., ::2], -1), axis=-1)) to x's shape:
    each pair (a, b) becomes (-b, a) (GPT-J / Meta Llama's interleaved rotary)."""
    flat = prod(r, "Reshape", "Flatten")
    cat = prod(flat.inputs[0], "Concat") if flat else None
    if cat is None or len(cat.inputs) != 2 or attr(cat, "axis") not in (-1, 4):
        return False
    odd_u, even_u = prod(cat.inputs[0], "Unsqueeze"), prod(cat.inputs[1], "Unsqueeze")
    if odd_u is None or even_u is None or axes_of(odd_u) not in ([-1], [4]) or axes_of(even_u) not in ([-1], [4]):
        return False
    neg = prod(odd_u.inputs[0], "Neg")
    odd = prod(neg.inputs[0], "Slice") if neg else None
    even = prod(even_u.inputs[0], "Slice")
    return bool(odd and even and odd.inputs[0] is x and even.inputs[0] is x
                and (_const_at(odd, 1), _const_at(odd, 4), _const_at(even, 1), _const_at(even, 4)) == (1, 2, 0, 2)
                and _slice_axis(odd) in (-1, 3) and _slice_axis(even) in (-1, 3))


def caches(cos: ir.Value, sin: ir.Value, head_dim: int | None, max_pos: int,
           interleaved: bool = False, half: bool = False) -> tuple[np.ndarray, np.ndarray] | str:
    """(cos_cache, sin_cache) [max_pos, head_dim/2] equal to what the graph computes, or why not; `head_dim`:
    the dims that rotate (the rotary width of a partial rotary; None: as many as the frequencies).
    `interleaved`: the source's tables repeat each frequency twice in a row rather than in two halves;
    `half`: they hold each once (opset 23's RotaryEmbedding). The angles are computed in fp32 from the
    graph's inv_freq, whatever float type the graph computes them in."""
    cos_table, sin_table = _tables(cos), _tables(sin)
    if cos_table is not None and sin_table is not None:
        if half:
            return "precomputed half-width cos/sin tables"
        return _from_tables(cos_table, sin_table, head_dim, max_pos, interleaved)
    c, s = _trace(cos, "Cos", interleaved or half), _trace(sin, "Sin", interleaved or half)
    if isinstance(c, str):
        return c
    if isinstance(s, str):
        return s
    (inv_c, scale_c), (inv_s, scale_s) = c, s
    if not np.array_equal(inv_c, inv_s):
        return "cos and sin use different frequencies"
    if head_dim is not None and inv_c.size * 2 != head_dim:
        return f"{inv_c.size * 2} frequencies for a rotary width of {head_dim}"
    # positions x inv_freq in fp32, as the exported graph computes it, so the caches match bit for bit
    freqs = np.arange(max_pos, dtype=np.float32)[:, None] * inv_c.astype(np.float32)[None, :]
    cos_cache = (np.cos(freqs) * np.float32(scale_c)).astype(np.float32)
    sin_cache = (np.sin(freqs) * np.float32(scale_s)).astype(np.float32)
    return cos_cache, sin_cache


def _tables(v: ir.Value | None) -> np.ndarray | None:
    """A precomputed [positions, hd] table gathered by position (HF's cos_cached, our decompose)."""
    for _ in range(4):
        n = prod(v)
        if n is None:
            return None
        if n.op_type == "Gather" and attr(n, "axis", 0) == 0:
            t = const(n.inputs[0])
            return t if t is not None and t.ndim == 2 else None
        if n.op_type not in ("Unsqueeze", "Cast", "Reshape"):
            return None
        v = n.inputs[0]
    return None


def _from_tables(cos: np.ndarray, sin: np.ndarray, head_dim: int | None, max_pos: int,
                 interleaved: bool) -> tuple[np.ndarray, np.ndarray] | str:
    if cos.shape != sin.shape or cos.shape[1] != (head_dim or cos.shape[1]):
        return f"cos/sin tables of shape {cos.shape} for head_dim {head_dim}"
    first, second = _halves(cos.shape[1], interleaved)
    if not all(np.array_equal(t[:, first], t[:, second]) for t in (cos, sin)):
        return ("cos/sin tables do not repeat each frequency in pairs" if interleaved
                else "cos/sin tables are not duplicated halves (interleaved rotary?)")
    rows = min(max_pos, cos.shape[0])  # the source cannot address positions past its own table
    return cos[:rows, first].astype(np.float32), sin[:rows, first].astype(np.float32)


def _halves(head_dim: int, interleaved: bool) -> tuple[slice, slice]:
    """Where a table of head_dim columns holds each frequency's two copies."""
    half = head_dim // 2
    return (slice(0, None, 2), slice(1, None, 2)) if interleaved else (slice(0, half), slice(half, None))


# ops that move a table's entries without computing new ones (a half taken, repeated, transposed, gathered
# by index: Helium's repeat_interleave); `verify` checks the layout they make by value
_LAYOUT_OPS = ("Unsqueeze", "Cast", "Reshape", "Squeeze", "Expand", "Transpose", "Slice", "Gather", "GatherND")


def _trace(v: ir.Value | None, op: str, interleaved: bool) -> tuple[np.ndarray, float] | str:
    """Walk up from the multiplied-in table to Cos/Sin: (inv_freq, scaling). An interleaved table may
    repeat its entries after Cos/Sin (Concat / Tile, then Reshape); `verify` checks the layout."""
    scale = 1.0
    for _ in range(10):
        n = prod(v)
        if n is None:
            return f"{op} table is a graph input"
        if n.op_type == op:
            return _inv_freq(n.inputs[0], scale, interleaved)
        repeats = interleaved and n.op_type in ("Concat", "Tile", "Flatten")
        if n.op_type in _LAYOUT_OPS or repeats:
            v = n.inputs[0]
        elif n.op_type == "Mul" and (operand := scalar_operand(n)):
            v, k = operand
            scale *= k
        else:
            return f"unexpected {n.op_type} between {op} and the rotation"
    return f"{op} not found"


def _inv_freq(freqs: ir.Value | None, scale: float, interleaved: bool) -> tuple[np.ndarray, float] | str:
    """freqs = Concat(f, f) with f = positions x inv_freq: the first 1-D float constant above f.
    Interleaved tables are spelt in several ways (Concat of Unsqueezes, Expand, Tile, then Reshape):
    the layout is left to `verify`, which compares the source's values with the caches."""
    cat = prod(freqs, "Concat")
    if interleaved:
        start = freqs
    elif cat is None or len(cat.inputs) != 2 or cat.inputs[0] is not cat.inputs[1]:
        return "frequencies are not duplicated halves (interleaved rotary?)"
    else:
        start = cat.inputs[0]
    # breadth first, the nearest such constant: an interleaved table's repeat can be a long index computation
    # (repeat_interleave as NonZero / GatherND); `verify` rejects a wrong pick by value
    seen: set[int] = set()
    todo = deque([start])
    while todo:
        v = todo.popleft()
        c = const(v)
        if c is not None:
            if c.dtype.kind == "f" and c.size > 1 and c.squeeze().ndim == 1:
                return c.reshape(-1), scale
            continue
        n = prod(v)
        if n is not None and id(n) not in seen and len(seen) < 64:
            seen.add(id(n))
            todo.extend(x for x in n.inputs if x is not None)
    return "inv_freq constant not found"


def angles_in_fp16(v: ir.Value | None) -> bool:
    """Does the source compute its RoPE angles in fp16 (onnxruntime's float16 converter's output): then
    they are exact only at the first positions."""
    for _ in range(10):
        n = prod(v)
        if n is None:
            return False
        if n.op_type in ("Cos", "Sin", "Gather"):
            x = n.inputs[0]
            return x is not None and x.type is not None and x.type.dtype == ir.DataType.FLOAT16
        v = n.inputs[0]
    return False


def verify(cos: ir.Value, sin: ir.Value, tables: tuple[np.ndarray, np.ndarray], n: int = 16,
           interleaved: bool = False, far_end: bool = True, half: bool = False) -> float | str:
    """Max |source - cache| over probe positions at both ends of the caches (the first only without
    `far_end`), or why it cannot run. The source's own cos/sin subgraph is evaluated on onnxruntime
    (fusion.probe)."""
    from webbuild.fusion import probe

    worst = 0.0
    for past in (0, tables[0].shape[0] - n) if far_end else (0,):
        got = probe.evaluate([cos, sin], probe.decoder_feeds(past, n))
        if isinstance(got, str):
            return got
        for src, cache in zip(got, tables):
            src = src.reshape(n, -1)
            first, second = (slice(None), slice(None)) if half else _halves(src.shape[1], interleaved)
            want = cache[past:past + n]
            src = src.astype(np.float32)
            worst = max(worst, float(np.abs(src[:, first] - want).max()), float(np.abs(src[:, second] - want).max()))
    return worst

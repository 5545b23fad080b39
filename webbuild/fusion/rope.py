"""Rotary embedding: recognise rotate_half RoPE and rebuild its cos/sin tables as GQA caches.

The source computes cos/sin from position ids at run time (Cos/Sin of positions x inv_freq, times
an attention scaling). GroupQueryAttention wants them precomputed per position: [max_pos, hd/2].
inv_freq and the scaling are read from the graph's constants, so rope_theta and scaled variants
(linear, llama3, yarn: all fold into inv_freq / scaling) need no config.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from webbuild.graph.ir import attr, const, other, prod, scalar_operand


@dataclass
class Rope:
    x: ir.Value    # the tensor being rotated, [B, heads, S, hd]
    cos: ir.Value  # as multiplied in, e.g. Unsqueeze(cos, 1)
    sin: ir.Value


def match(v: ir.Value) -> Rope | None:
    """v = x*cos + rotate_half(x)*sin (any operand order), or None."""
    add = prod(v, "Add")
    if add is None:
        return None
    for m1, m2 in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        a, b = prod(m1, "Mul"), prod(m2, "Mul")
        if a is None or b is None:
            continue
        for x in a.inputs:
            rot = next((r for r in b.inputs if _is_rotate_half(r, x)), None)
            if rot is not None:
                return Rope(x, other(a, x), other(b, rot))
    return None


def _is_rotate_half(r: ir.Value, x: ir.Value) -> bool:
    """r = Concat(-x[..., h:], x[..., :h], axis=-1)."""
    cat = prod(r, "Concat")
    if cat is None or len(cat.inputs) != 2 or attr(cat, "axis") not in (-1, 3):
        return False
    neg = prod(cat.inputs[0], "Neg")
    hi = prod(neg.inputs[0], "Slice") if neg else None
    lo = prod(cat.inputs[1], "Slice")
    return bool(hi and lo and hi.inputs[0] is x and lo.inputs[0] is x)


def caches(cos: ir.Value, sin: ir.Value, head_dim: int, max_pos: int) -> tuple[np.ndarray, np.ndarray] | str:
    """(cos_cache, sin_cache) [max_pos, head_dim/2] equal to what the graph computes, or why not."""
    tables = _tables(cos), _tables(sin)
    if all(t is not None for t in tables):
        return _from_tables(*tables, head_dim, max_pos)
    c, s = _trace(cos, "Cos"), _trace(sin, "Sin")
    if isinstance(c, str) or isinstance(s, str):
        return c if isinstance(c, str) else s
    (inv_c, scale_c), (inv_s, scale_s) = c, s
    if not np.array_equal(inv_c, inv_s):
        return "cos and sin use different frequencies"
    if inv_c.size * 2 != head_dim:
        return f"partial rotary ({inv_c.size * 2} of {head_dim} dims)"
    # positions x inv_freq in fp32, as the exported graph computes it, so the caches match bit for bit
    freqs = np.arange(max_pos, dtype=np.float32)[:, None] * inv_c.astype(np.float32)[None, :]
    cos_cache = (np.cos(freqs) * np.float32(scale_c)).astype(np.float32)
    sin_cache = (np.sin(freqs) * np.float32(scale_s)).astype(np.float32)
    return cos_cache, sin_cache


def _tables(v: ir.Value) -> np.ndarray | None:
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


def _from_tables(cos: np.ndarray, sin: np.ndarray, head_dim: int, max_pos: int) -> tuple[np.ndarray, np.ndarray] | str:
    half = head_dim // 2
    if cos.shape != sin.shape or cos.shape[1] != head_dim:
        return f"cos/sin tables of shape {cos.shape} for head_dim {head_dim}"
    if not (np.array_equal(cos[:, :half], cos[:, half:]) and np.array_equal(sin[:, :half], sin[:, half:])):
        return "cos/sin tables are not duplicated halves (interleaved rotary?)"
    rows = min(max_pos, cos.shape[0])  # the source cannot address positions past its own table
    return cos[:rows, :half].astype(np.float32), sin[:rows, :half].astype(np.float32)


def _trace(v: ir.Value, op: str) -> tuple[np.ndarray, float] | str:
    """Walk up from the multiplied-in table to Cos/Sin: (inv_freq, scaling)."""
    scale = 1.0
    for _ in range(8):
        n = prod(v)
        if n is None:
            return f"{op} table is a graph input"
        if n.op_type == op:
            return _inv_freq(n.inputs[0], scale)
        if n.op_type in ("Unsqueeze", "Cast", "Reshape", "Squeeze", "Expand"):
            v = n.inputs[0]
        elif n.op_type == "Mul" and scalar_operand(n):
            v, k = scalar_operand(n)
            scale *= k
        else:
            return f"unexpected {n.op_type} between {op} and the rotation"
    return f"{op} not found"


def _inv_freq(freqs: ir.Value, scale: float) -> tuple[np.ndarray, float] | str:
    """freqs = Concat(f, f) with f = positions x inv_freq: the first 1-D float constant above f."""
    cat = prod(freqs, "Concat")
    if cat is None or len(cat.inputs) != 2 or cat.inputs[0] is not cat.inputs[1]:
        return "frequencies are not duplicated halves (interleaved rotary?)"
    seen, todo = set(), [cat.inputs[0]]
    while todo:
        v = todo.pop()
        c = const(v)
        if c is not None:
            if c.dtype.kind == "f" and c.size > 1 and c.squeeze().ndim == 1:
                return c.reshape(-1), scale
            continue
        n = prod(v)
        if n is not None and id(n) not in seen and len(seen) < 16:
            seen.add(id(n))
            todo.extend(x for x in n.inputs if x is not None)
    return "inv_freq constant not found"


def verify(cos: ir.Value, sin: ir.Value, tables: tuple[np.ndarray, np.ndarray], n: int = 16) -> float | str:
    """Max |source - cache| over probe positions at both ends of the caches, or why it cannot run.
    The source's own cos/sin subgraph is evaluated on onnxruntime (fusion.probe)."""
    from webbuild.fusion import probe

    worst = 0.0
    for past in (0, tables[0].shape[0] - n):
        got = probe.evaluate([cos, sin], probe.decoder_feeds(past, n))
        if isinstance(got, str):
            return got
        for src, cache in zip(got, tables):
            src = src.reshape(n, -1)
            half = cache.shape[1]
            want = cache[past:past + n]
            worst = max(worst, float(np.abs(src[:, :half] - want).max()), float(np.abs(src[:, half:] - want).max()))
    return worst

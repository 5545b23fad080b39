"""Attention -> com.microsoft.GroupQueryAttention with RoPE folded in (do_rotary=1), or without (NoPE layers).

Anchored on Softmax, it walks what attention computes,
    softmax(Q_rope @ repeat_kv(K_all)^T * scale + causal mask) @ repeat_kv(V_all) -> Transpose -> Reshape,
in the spellings exporters use: scalar factors on the scores, on Q or on K (their product is the
scale; SDPA's computed from Q's shape at run time counts, shape_scalar); K transposed to [.., hd, T]
before or after repeat_kv and the factors (or by Reshape -> Transpose -> Reshape: torch.onnx dynamo's
opset-20 SDPA), or not at all under an Einsum that contracts over hd (the probabilities times V then an
Einsum too); repeat_kv by Expand or Tile of an Unsqueeze, then Reshape; the mask added, or selecting
between the scores and a very negative fill, in any number of parts; a softcap c * tanh(scores / c) under
the mask (Gemma2's: GQA's softcap); a cast or SDPA's NaN guard
(Where(IsNaN(p), 0, p)) around the probabilities. Anchored on opset 23's standard Attention, it reads the
same parts from the op's inputs (its scale, its mask or is_causal). RoPE is rotate_half or interleaved
pairs, on the whole head or its first dims (partial rotary: the caches' width), or opset 23's
RotaryEmbedding (rope.py); Q and K without any RoPE make a NoPE layer (do_rotary=0, no caches). A RoPE
whose caches GQA cannot take (widths its rotary kernels refuse, tables not rebuilt or not equal to the
source's) stays as the source computes it, and GQA takes Q and K rotated (do_rotary=0). Q/K/V are
projection outputs reshaped to heads (optional Q/K RMSNorm, already fused into SimplifiedLayerNormalization,
before or after the head transpose: Gemma3's comes after, and moves before it) and transposed to BNSH,
K_all = Concat(past_k, K_rope) or K_rope, or a static KV buffer the new rows are written into by ScatterND
(static_cache: GQA over a shared past/present buffer, once the write positions and the mask are proven GQA's by
value; any other write refused). Nothing is read by name: the mask is dropped only once its values, evaluated
for probe inputs, are the causal mask GQA applies itself, or a causal sliding window (local_window_size)
(attention_mask.causal_window).
The GQA node takes the projection outputs (Q/K norms stay as explicit SimplifiedLayerNormalization
on the head axis, then a Reshape back to [B, S, heads*hd]), the past KV (BNSH), seqlens_k /
total_sequence_length from attention_mask (for a static buffer from the mask's values alone: the mask spans
the buffer), and cos/sin caches in the attention's float type; its present outputs replace K_all / V_all (so a
graph output keeps its name). Position ids, given or derived, are not needed: GQA counts positions from the
past length.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from webbuild.fusion import rope, shape_scalar, static_cache
from webbuild.fusion.attention_mask import MASKED, Mask, causal_window, gqa_lengths, static_causal
from webbuild.fusion.rule import Miss, Rule
from webbuild.graph.ir import (
    MS,
    attr,
    axes_of,
    const,
    import_ms_domain,
    only_user,
    prod,
    producer_of,
    replace,
    scalar,
    scalar_operand,
    shared_const,
    width,
)

NAME = "gqa"
DEFAULT_MAX_POSITIONS = 4096
ROPE_TOLERANCE = 1e-3  # fp32 angles near position 65k carry ~1e-4 of rounding either way
FP16_ROPE_TOLERANCE = 1e-2  # fp16 angles up to 16 are rounded to 2^-7: cos/sin within 4e-3, plus fp16 outputs


@dataclass
class _Heads:
    proj: ir.Value             # [B, S, heads*hd], what GQA consumes (before any norm)
    norm: ir.Node | None       # SimplifiedLayerNormalization on [B, S, heads, hd], or on [B, heads, S, hd]
    head_dim: int
    factor: float = 1.0        # scalar factors on the way (the softmax scale put on Q or K)
    count: int = 0             # heads, known once all three branches are read
    heads: ir.Value | None = None  # [B, S, heads, hd] when the norm comes after the head transpose (Gemma3)


@dataclass
class _Match:
    q: _Heads
    k: _Heads
    v: _Heads
    past_k: ir.Value | None
    past_v: ir.Value | None
    k_all: ir.Value
    v_all: ir.Value
    out: ir.Value              # [B, S, heads*hd], the attention output fed to o_proj
    scale: float
    head_dim: int
    rope: rope.Rope | None  # None: no RoPE (a NoPE layer)
    anchor: ir.Node
    masks: list[Mask] = field(default_factory=list)  # what the scores are masked with, checked by value
    caches: tuple[np.ndarray, np.ndarray] | None = None  # cos/sin for GQA, once checked against the source
    window: int | None = None  # a causal sliding window's width, read from the masks' values
    rotated: tuple[ir.Value, ir.Value] | None = None  # Q and K as RoPE leaves them, [B, heads, S, hd]
    outer_scale: float = 1.0   # the factors between the RoPE and the scores (the rest are on Q or K before it)
    rope_kept: str | None = None  # why the RoPE stays as the source computes it (GQA then takes rotated Q, K)
    softcap: float = 0.0       # GQA's softcap: c * tanh(scores / c) before the mask (0: none)
    static: tuple[static_cache.Write, static_cache.Write] | None = None  # K and V written into static buffers


def rule(max_positions: int | None = None) -> Rule[_Match]:
    """The GQA rule for one run, its cos/sin caches max_positions long (DEFAULT_MAX_POSITIONS when unknown)."""
    checks = _Checks(max_positions)
    return Rule(NAME, ("Softmax", "Attention"), checks.match, _rewrite, notes=checks.notes, setup=checks.clear)


@dataclass
class _Checks:
    """What is checked against the source for the attentions of one graph: the cos/sin caches, once per
    cos/sin pair (the layers share one), and each attention's masks, over the positions the caches reach."""
    max_positions: int | None
    errors: dict[tuple[int, int], float | str] = field(default_factory=dict)  # max abs error, or why unchecked
    windows: set[int] = field(default_factory=set)  # sliding windows found
    kept: list[str] = field(default_factory=list)  # why each RoPE left as the source computes it stayed
    static: int = 0  # attentions over static KV buffers made GQA over a shared buffer

    def clear(self) -> None:
        self.errors.clear()
        self.windows.clear()
        self.kept.clear()
        self.static = 0

    def match(self, anchor: ir.Node) -> _Match | Miss | None:
        m = match(anchor) if anchor.op_type == "Softmax" else match_standard(anchor)
        if m is None or isinstance(m, Miss):
            return m
        tables = self._caches(m) if m.rope is not None else None
        if isinstance(tables, Miss):  # GQA cannot rotate as the source does: it takes Q and K rotated
            if m.rotated is None:
                return tables
            self.kept.append(tables.reason)
            m = dataclasses.replace(m, rope_kept=tables.reason)
            tables = None
        positions = tables[0].shape[0] if tables is not None else self._positions(m)
        if m.static is not None:
            why = self._static(m, positions)
            return Miss(why) if why else dataclasses.replace(m, caches=tables)
        window = causal_window(m.masks, positions) if m.masks else None  # none: causal by the op itself
        if isinstance(window, str):
            return Miss(window)
        if window is not None:
            self.windows.add(window)
        return dataclasses.replace(m, caches=tables, window=window)

    def _caches(self, m: _Match) -> tuple[np.ndarray, np.ndarray] | Miss:
        """GQA's cos/sin caches for `m`'s RoPE, computed in fp32 and checked against the source's own
        cos/sin: at both ends of the caches for an fp32 source, at the first positions (where its angles are
        exact to fp16's precision) for one that computes them in fp16; in the attention's float type."""
        r = m.rope
        assert r is not None, "called for an attention with RoPE"
        width = r.dims if r.partial else m.head_dim
        tables = rope.caches(r.cos, r.sin, width, self._positions(m), r.interleaved, r.half)
        if isinstance(tables, str):
            return Miss(tables)
        rotary = tables[0].shape[1] * 2
        if m.head_dim % 16 or rotary % 16 or rotary > m.head_dim:
            return Miss(f"RoPE on {rotary} of {m.head_dim} dims (GroupQueryAttention's kernels take a head size "
                        "and a rotary width that are multiples of 16)")
        half = rope.angles_in_fp16(r.cos)
        key = (id(r.cos), id(r.sin))
        if key not in self.errors:
            self.errors[key] = rope.verify(r.cos, r.sin, tables, interleaved=r.interleaved, far_end=not half,
                                           half=r.half)
        err = self.errors[key]
        if not isinstance(err, str) and err > (FP16_ROPE_TOLERANCE if half else ROPE_TOLERANCE):
            return Miss(f"cos/sin caches differ from the source by {err:.2e}")
        dtype = _float_type(m.out)
        return tables[0].astype(dtype), tables[1].astype(dtype)

    def _positions(self, m: _Match) -> int:
        """The positions GQA reaches: the model's, or a static KV buffer's declared length when longer."""
        known = self.max_positions or DEFAULT_MAX_POSITIONS
        return max(known, m.static[0].buffer or 0) if m.static is not None else known

    def _static(self, m: _Match, positions: int) -> str | None:
        """Why an attention over static KV buffers is not GQA's over a shared buffer: its mask, or where
        ScatterND writes K and V (checked by value, in a buffer of its declared length or of `positions`)."""
        assert m.static is not None, "called for an attention over static buffers"
        buffer = m.static[0].buffer or positions
        if m.static[1].buffer not in (None, buffer):
            return "K and V static buffers of different lengths"
        why = static_causal(m.masks, buffer) or next(
            (w for w in (static_cache.check(x, m.k.count, m.head_dim, buffer) for x in m.static) if w), None)
        if why is None:
            self.static += 1
        return f"a static KV cache written in place by ScatterND: {why}" if why else None

    def notes(self, hits: int) -> list[str]:
        checked = [f"{NAME}: cos/sin caches vs the source at the first and last 16 positions: "
                   + (f"max abs error {err:.2e}" if not isinstance(err, str) else f"not checked ({err})")
                   for err in self.errors.values()]
        unsized = [f"{NAME}: max positions unknown, cos/sin caches sized {DEFAULT_MAX_POSITIONS}"]
        windows = [f"{NAME}: causal sliding window of {w} positions (local_window_size {w})"
                   for w in sorted(self.windows)]
        kept = [f"{NAME}: RoPE left as the source computes it, GQA given Q and K rotated (x{n}): {why}"
                for why, n in Counter(self.kept).items()]
        static = [f"{NAME}: {self.static} over a static KV cache written by ScatterND: GroupQueryAttention on a "
                  "shared past/present buffer (present keeps the buffer's length; lengths from the mask's values)"]
        return checked + (unsized if hits and not self.max_positions else []) + windows + kept + \
            (static if self.static else [])


def match(sm: ir.Node) -> _Match | Miss:
    """The attention around Softmax `sm`, caches not yet made."""
    if attr(sm, "axis", -1) not in (-1, 3):
        return Miss("Softmax not over the last axis")
    found = _scores(sm.inputs[0])
    if found is None:
        return Miss("Softmax input is not (Q @ K^T) * scale [+ mask]")
    qk, scale, masks = found.qk, found.scale, list(found.masks)
    q_rot, q_scale = _factors(qk.inputs[0])
    key = _key(qk.inputs[1], transpose=bool(_k_as_hd_t(qk)))
    if isinstance(key, Miss):
        return key
    k_all, k_scale = key
    pv = _probs_times_v(sm.outputs[0])
    if pv is None:
        return Miss("Softmax output is not multiplied by V")
    out = _merge_heads(pv.outputs[0])
    if out is None:
        return Miss("attention output is not transposed/reshaped back to [B, S, heads*hd]")
    v_all = _unrepeat(pv.inputs[1])
    if isinstance(v_all, Miss):
        return v_all
    m = _assemble(sm, q_rot, k_all, v_all, out, scale * q_scale * k_scale, masks)
    return dataclasses.replace(m, softcap=found.softcap) if isinstance(m, _Match) else m


def match_standard(att: ir.Node) -> _Match | Miss | None:
    """opset 23's standard Attention on [B, heads, S, hd] Q/K/V (torch.onnx's dynamo export of SDPA), its
    Q and K rotated by the standard RotaryEmbedding or spelt out; None for another domain's Attention."""
    if att.domain not in ("", "ai.onnx"):
        return None
    if any(x is not None for x in att.inputs[4:]) or any(o.uses() for o in att.outputs[1:]):
        return Miss("an Attention with past KV inputs or present outputs of its own")
    q_rot = att.inputs[0]
    if q_rot is None or q_rot.shape is None or len(q_rot.shape) != 4:
        return Miss("an Attention on 3-D Q/K/V")
    if attr(att, "softcap", 0.0) or attr(att, "qk_matmul_output_mode", 0):
        return Miss("an Attention with a softcap or a Q.K output")
    mask = att.inputs[3] if len(att.inputs) > 3 else None
    causal = bool(attr(att, "is_causal", 0))
    if causal and mask is not None:
        return Miss("an Attention with both is_causal and a mask")
    k_all, v_all = _unrepeat(att.inputs[1]), _unrepeat(att.inputs[2])
    if isinstance(k_all, Miss) or isinstance(v_all, Miss):
        return next(x for x in (k_all, v_all) if isinstance(x, Miss))
    out = _merge_heads(att.outputs[0])
    if out is None:
        return Miss("attention output is not transposed/reshaped back to [B, S, heads*hd]")
    boolean = mask is not None and mask.type is not None and mask.type.dtype == ir.DataType.BOOL
    masks = [] if mask is None else [Mask(mask, "keep" if boolean else "add")]
    m = _assemble(att, q_rot, k_all, v_all, out, attr(att, "scale", 0.0) or None, masks, causal=causal)
    return m


def _assemble(anchor: ir.Node, q_rot: ir.Value | None, k_all: ir.Value | None, v_all: ir.Value | None,
              out: ir.Value, scale: float | None, masks: list[Mask], causal: bool = False) -> _Match | Miss:
    """The parts every attention spelling shares, from the rotated Q, K_all and V_all (repeat_kv taken off)
    on: RoPE, the past, the projections. `scale` None: 1/sqrt(head size); `causal`: causal by the op itself."""
    r = rope.match(q_rot)
    if r is None and isinstance(_heads(q_rot), Miss):
        return Miss("no RoPE (rotate_half or interleaved) on Q")
    if k_all is None or v_all is None:
        return Miss("K or V is an absent input")
    writes = static_cache.match(k_all, _new_rows), static_cache.match(v_all, _new_rows)
    if isinstance(writes[0], Miss) or isinstance(writes[1], Miss):
        return next(w for w in writes if isinstance(w, Miss))
    static = (writes[0], writes[1]) if writes[0] is not None and writes[1] is not None else None
    if static is None and writes != (None, None):
        return Miss("K and V cached differently (one written into a static buffer by ScatterND)")
    (past_k, k_new), (past_v, v_new) = ((static[0].past, static[0].new), (static[1].past, static[1].new)) \
        if static is not None else (_split_past(k_all), _split_past(v_all))
    rk = rope.match(k_new)
    if r is None and rk is None:  # a layer without RoPE (NoPE): Q and K straight from their projections
        q, k, v = _heads(q_rot), _heads(k_new), _heads(v_new)
    elif r is None or rk is None or _rope_key(rk) != _rope_key(r):
        return Miss("K is not rotated with Q's cos/sin")
    else:
        q, k, v = _heads(r.x), _heads(rk.x), _heads(v_new)
    if isinstance(q, Miss) or isinstance(k, Miss) or isinstance(v, Miss):
        return next(x for x in (q, k, v) if isinstance(x, Miss))
    if v.factor != 1.0:
        return Miss("V is scaled")
    if k.head_dim != q.head_dim or v.head_dim != q.head_dim:
        return Miss("Q, K and V head sizes differ")
    if not masks and not causal:
        return Miss("no mask on the scores: the attention is not causal")
    scale = q.head_dim ** -0.5 if scale is None else scale
    m = _Match(q=q, k=k, v=v, past_k=past_k, past_v=past_v, k_all=k_all, v_all=v_all, out=out,
               scale=scale * q.factor * k.factor, head_dim=q.head_dim, rope=r, anchor=anchor, masks=masks,
               rotated=(q_rot, k_new) if r is not None and q_rot is not None and k_new is not None else None,
               outer_scale=scale, static=static)
    return _count_heads(m) or m


def _new_rows(v: ir.Value) -> bool:
    """Are `v` the new K/V heads [B, kv, S, hd] (a RoPE's output, or a projection's heads)?"""
    return rope.match(v) is not None or not isinstance(_heads(v), Miss)


def _rope_key(r: rope.Rope) -> tuple:
    """What Q's and K's RoPE must share."""
    return r.cos, r.sin, r.interleaved, r.partial, r.half


def _count_heads(m: _Match) -> Miss | None:
    """Turn per-branch head sizes into head counts and check them against each other."""
    widths = [width(b.proj) for b in (m.q, m.k, m.v)]
    known = [w for w in widths if w is not None]
    if len(known) != len(widths):
        return Miss("projection widths unknown")
    for b, w in zip((m.q, m.k, m.v), known):
        b.count = w // m.head_dim
    if m.k.count != m.v.count or m.q.count % m.k.count or known[0] % m.head_dim:
        return Miss(f"inconsistent heads: q {widths[0]}, k {widths[1]}, v {widths[2]}, head_dim {m.head_dim}")
    return None


def _strip_cast(v: ir.Value | None) -> ir.Value | None:
    while (n := prod(v, "Cast")) is not None:
        v = n.inputs[0]
    return v


def _factor(v: ir.Value | None) -> tuple[ir.Value | None, float] | None:
    """v = x * k or x / k with k a scalar constant, or computed from the head size (shape_scalar):
    (x, the factor)."""
    n = prod(v, "Mul", "Div")
    if n is None:
        return None
    if n.op_type == "Div":
        k = scalar(n.inputs[1])
        return (n.inputs[0], 1.0 / k) if k and const(n.inputs[0]) is None else None
    found = scalar_operand(n)
    if found is not None:
        return found
    for x, operand in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
        ok = x is not None and operand is not None and _scalar_shaped(operand)
        f = shape_scalar.evaluate(operand, _last_dim) if ok else None
        if f is not None:
            return x, f
    return None


def _scalar_shaped(v: ir.Value) -> bool:
    """A value shape inference says holds one element (SDPA's computed scale)."""
    return v.shape is not None and all(d == 1 for d in v.shape)


def _last_dim(x: ir.Value) -> int | None:
    """The head size of `x`, Q or K in [B, heads, S, hd] (rotated, or as reshaped to heads)."""
    r = rope.match(x)
    h = _heads(r.x if r is not None else x)
    return None if isinstance(h, Miss) else h.head_dim


def _factors(v: ir.Value | None) -> tuple[ir.Value | None, float]:
    """Strip scalar factors: (what they multiply, their product)."""
    scale = 1.0
    while (f := _factor(v)) is not None:
        v, k = f
        scale *= k
    return v, scale


@dataclass(frozen=True)
class _Scores:
    qk: ir.Node                # the Q @ K^T product
    scale: float = 1.0         # the scalar factors on it
    masks: tuple[Mask, ...] = ()
    softcap: float = 0.0       # softcap * tanh(scores / softcap) before the masks (Gemma2's); 0: none


def _scores(v: ir.Value | None, depth: int = 0) -> _Scores | None:
    """The scores under casts, scalar factors, a softcap and masks in any order (factors inside a softcap,
    masks outside it: as GQA applies them): a mask is added (Add) or selects between the scores and a very
    negative fill (Where)."""
    v = _strip_cast(v)
    n = prod(v)
    if n is None or depth > 8:
        return None
    if n.op_type == "MatMul" or (n.op_type == "Einsum" and _k_as_hd_t(n) is not None):
        return _Scores(n)
    capped = _softcap(v)
    if capped is not None:
        found = _scores(capped[0], depth + 1)
        ok = found is not None and not found.masks and not found.softcap
        return dataclasses.replace(found, softcap=capped[1]) if ok and found is not None else None
    f = _factor(v)
    if f is not None:
        found = _scores(f[0], depth + 1)
        if found is None or found.softcap:  # a factor outside the softcap is no scale GQA applies
            return None
        return dataclasses.replace(found, scale=found.scale * f[1])
    if n.op_type == "Add":
        for x, mask in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
            found = _scores(x, depth + 1)
            if found and mask is not None:
                return dataclasses.replace(found, masks=(*found.masks, Mask(mask, "add")))
    if n.op_type == "Where":
        cond, a, b = n.inputs
        for x, fill, kind in ((a, b, "keep"), (b, a, "drop")):
            if (scalar(fill) or 0.0) <= MASKED:
                found = _scores(x, depth + 1)
                if found and cond is not None:
                    return dataclasses.replace(found, masks=(*found.masks, Mask(cond, kind)))
    return None


def _softcap(v: ir.Value | None) -> tuple[ir.Value, float] | None:
    """v = c * tanh(x / c) (or x * (1/c) inside) with c a scalar constant: (x, c)."""
    mul = prod(v, "Mul")
    outer = scalar_operand(mul) if mul is not None else None
    tanh = prod(outer[0], "Tanh") if outer is not None else None
    inner = _factor(tanh.inputs[0]) if tanh is not None else None
    if outer is None or inner is None or inner[0] is None or outer[1] <= 0:
        return None
    return (inner[0], outer[1]) if abs(inner[1] * outer[1] - 1.0) < 1e-6 else None


def _k_as_hd_t(qk: ir.Node) -> bool | None:
    """Whether the scores' product takes K as [.., hd, T] (a MatMul; an Einsum such as bhsd,bhdt->bhst)
    rather than [.., T, hd] (an Einsum such as bhsd,bhtd->bhst, K untransposed); None: no Q.K product."""
    if qk.op_type == "MatMul":
        return True
    terms = _einsum_terms(qk)
    if terms is None:
        return None
    (q, k), out = terms
    if q[2] != out[2] or q[3] in out:
        return None
    return {out[3] + q[3]: False, q[3] + out[3]: True}.get(k[2:])


def _einsum_terms(n: ir.Node) -> tuple[tuple[str, str], str] | None:
    """An Einsum of two 4-D operands batched over the first two axes: ((lhs, rhs), output) subscripts."""
    eq = str(attr(n, "equation", "")).replace(" ", "")
    if eq.count("->") != 1 or eq.count(",") != 1 or len(n.inputs) != 2:
        return None
    lhs, out = eq.split("->")
    a, b = lhs.split(",")
    return ((a, b), out) if len(a) == len(b) == len(out) == 4 and a[:2] == b[:2] == out[:2] else None


def _key(v: ir.Value | None, transpose: bool = True) -> tuple[ir.Value | None, float] | Miss:
    """The right operand of Q @ K^T -> (K_all [B, kv, T, hd], scale): the transpose to [.., hd, T] when
    the product wants one (`transpose`), scalar factors and repeat_kv may come in any order."""
    scale, transposed, unrepeated = 1.0, not transpose, False
    for _ in range(8):
        f = _factor(v)
        t = prod(v, "Transpose")
        if f is not None:
            v, scale = f[0], scale * f[1]
        elif t is not None and not transposed and list(attr(t, "perm", [])) == [0, 1, 3, 2]:
            v, transposed = t.inputs[0], True
        elif not transposed and (flat := _flat_transpose(v)) is not None:
            v, transposed = flat, True
        elif not unrepeated and (u := _unrepeat(v)) is not v:
            if isinstance(u, Miss):
                return u
            v, unrepeated = u, True
        else:
            break
    if not transposed:
        return Miss("K is not transposed to [B, heads, hd, T]")
    return v, scale


def _flat_transpose(v: ir.Value | None) -> ir.Value | None:
    """k when v = Reshape(Transpose(Reshape(k, [-1, T, hd]), [0, 2, 1]), [*lead, hd, T]), the shapes read
    from Shape(k) (torch.onnx's dynamo export of SDPA at opset 20): k with its last two axes swapped."""
    outer = prod(v, "Reshape")
    t = prod(outer.inputs[0], "Transpose") if outer is not None else None
    inner = prod(t.inputs[0], "Reshape") if t is not None else None
    if outer is None or t is None or inner is None or list(attr(t, "perm", [])) != [0, 2, 1]:
        return None
    k = inner.inputs[0]
    if k is None:
        return None
    parts = [_shape_parts(x, k) for x in (inner.inputs[1], outer.inputs[1])]
    flat, back = ("-1", (-2, -1), (-1, None)), ((None, -2), (-1, None), (-2, -1))
    return k if parts == [flat, back] else None


def _shape_parts(target: ir.Value | None, k: ir.Value) -> tuple | None:
    """A Concat of Slices of Shape(k) (as (start, end), None for open ends) and constant -1s ("-1")."""
    cat = prod(target, "Concat")
    if cat is None:
        return None
    out: list = []
    for x in cat.inputs:
        c = const(x)
        sl = prod(x, "Slice")
        shape = prod(sl.inputs[0], "Shape") if sl is not None else None
        if c is not None and c.size == 1 and int(c.reshape(-1)[0]) == -1:
            out.append("-1")
        elif sl is not None and shape is not None and shape.inputs[0] is k and attr(shape, "start", 0) == 0 \
                and attr(shape, "end", None) is None and len(sl.inputs) == 3:
            ends = [const(sl.inputs[i]) for i in (1, 2)]
            if any(e is None or e.size != 1 for e in ends):
                return None
            out.append(tuple(None if abs(int(e.reshape(-1)[0])) >= 2**62 else int(e.reshape(-1)[0])
                             for e in ends if e is not None))
        else:
            return None
    return tuple(out)


def _probs_times_v(probs: ir.Value) -> ir.Node | None:
    """The MatMul of the probabilities with V, past a Cast and a guard that zeroes NaN rows
    (Where(IsNaN(p), 0, p): SDPA's fully masked rows)."""
    for _ in range(3):
        users = list(probs.consumers())
        if len(users) == 1 and users[0].op_type == "Cast":
            probs = users[0].outputs[0]
            continue
        guard = _nan_guard(probs, users)
        if guard is not None:
            probs = guard
            continue
        break
    users = list(probs.consumers())
    mm = users[0] if len(users) == 1 and users[0].op_type in ("MatMul", "Einsum") else None
    if mm is None or mm.inputs[0] is not probs:
        return None
    return mm if mm.op_type == "MatMul" or _is_probs_times_v(mm) else None


def _is_probs_times_v(n: ir.Node) -> bool:
    """An Einsum such as bhst,bhtd->bhsd: the probabilities [.., S, T] times V [.., T, hd]."""
    terms = _einsum_terms(n)
    if terms is None:
        return False
    (p, v), out = terms
    return p[2] == out[2] and p[3] == v[2] and v[3] == out[3] and p[3] not in out


def _nan_guard(p: ir.Value, users: list[ir.Node]) -> ir.Value | None:
    """Where(IsNaN(p), 0, p)'s output, when that is all that reads p."""
    isnan = next((u for u in users if u.op_type == "IsNaN"), None)
    where = next((u for u in users if u.op_type == "Where"), None)
    if len(users) != 2 or isnan is None or where is None:
        return None
    cond, fill, x = where.inputs
    return where.outputs[0] if cond is isnan.outputs[0] and x is p and scalar(fill) == 0.0 else None


def _merge_heads(v: ir.Value) -> ir.Value | None:
    """Transpose(0, 2, 1, 3) then Reshape to [B, S, heads*hd] of the attention's output `v`, past a Reshape
    of `v` to [B, -1, S, hd] (a no-op Hugging Face's SDPA path writes) whose hd `_same_heads` checks."""
    view = only_user(v, "Reshape")
    t = only_user(view.outputs[0] if view is not None else v, "Transpose")
    if t is None or list(attr(t, "perm", [])) != [0, 2, 1, 3]:
        return None
    r = only_user(t.outputs[0], "Reshape")
    if r is None or (view is not None and not _same_heads(view, r, v)):
        return None
    return r.outputs[0]


def _same_heads(view: ir.Node, merge: ir.Node, v: ir.Value) -> bool:
    """Is `view` Reshape(v, [B, -1, S, hd]) with B and S the values the merging Reshape's [B, S, -1] uses, and
    hd v's head size (read from the Q that v's attention consumes)? Then it is v unchanged."""
    a, b = prod(view.inputs[1], "Concat"), prod(merge.inputs[1], "Concat")
    if a is None or b is None or len(a.inputs) != 4 or len(b.inputs) != 3:
        return False
    minus_one, hd = const(a.inputs[1]), const(a.inputs[3])
    attention = v.producer()
    q = attention.inputs[0] if attention is not None and attention.op_type == "Attention" else None
    want = _last_dim(q) if q is not None else None
    return (a.inputs[0] is b.inputs[0] and a.inputs[2] is b.inputs[1] and minus_one is not None
            and int(minus_one.reshape(-1)[0]) == -1 and hd is not None and want is not None
            and int(hd.reshape(-1)[0]) == want)


def _unrepeat(v: ir.Value | None) -> ir.Value | None | Miss:
    """Strip repeat_kv: Reshape(Expand(Unsqueeze(x, 2))) or Reshape(Tile(Unsqueeze(x, 2))) -> x (each KV
    head repeated for its group of query heads, as GQA reads them). A whole-tensor Tile along the head
    axis puts the copies in another order (query head h reads KV head h mod kv): that is no GQA."""
    r = prod(v, "Reshape")
    e = prod(r.inputs[0], "Expand", "Tile") if r else None
    u = prod(e.inputs[0], "Unsqueeze") if e else None
    if u is not None and e is not None and axes_of(u) == [2]:
        reps = const(e.inputs[1]) if e.op_type == "Tile" else None
        if reps is None or (reps.size == 5 and list(reps[[0, 1, 3, 4]]) == [1, 1, 1, 1]):
            return u.inputs[0]
    tile = prod(v, "Tile")
    reps = const(tile.inputs[1]) if tile is not None else None
    if reps is not None and reps.size == 4 and reps[1] > 1:
        return Miss("K/V heads tiled whole (query head h would read KV head h mod kv), not repeated per group")
    return v


def _split_past(v: ir.Value | None) -> tuple[ir.Value | None, ir.Value | None]:
    cat = prod(v, "Concat")
    if cat is not None and len(cat.inputs) == 2 and attr(cat, "axis") in (2, -2):
        return cat.inputs[0], cat.inputs[1]
    return None, v


def _heads(v: ir.Value | None) -> _Heads | Miss:
    """BNSH tensor -> its projection: Transpose(0,2,1,3)(optional norm(Reshape(proj, [.., heads, hd]))),
    scalar factors before or after the Transpose."""
    v, factor = _factors(v)
    after = _head_norm(v)  # a norm over hd after the transpose: the same norm before it
    if after is not None:
        v = after.inputs[0]
    t = prod(v, "Transpose")
    if t is None or list(attr(t, "perm", [])) != [0, 2, 1, 3]:
        return Miss("Q/K/V not transposed from [B, S, heads, hd]")
    x, inner = _factors(t.inputs[0])
    factor *= inner
    norm = _head_norm(x)
    if norm is not None:
        x = norm.inputs[0]
    if norm is not None and after is not None:
        return Miss("two Q/K norms, before and after the head transpose")
    if after is not None and inner != 1.0:
        return Miss("a factor between the head reshape and a Q/K norm")
    r = prod(x, "Reshape")
    hd = _head_dim(r) if r is not None else None
    if r is None or hd is None or r.inputs[0] is None:
        return Miss("Q/K/V not reshaped to [B, S, heads, hd] with a known hd")
    return _Heads(r.inputs[0], norm or after, hd, factor, heads=r.outputs[0] if after is not None else None)


def _head_norm(v: ir.Value | None) -> ir.Node | None:
    """The standard-domain SimplifiedLayerNormalization (over the last axis, hd) producing `v`."""
    n = prod(v, "SimplifiedLayerNormalization")
    return n if n is not None and n.domain == "" and attr(n, "axis", -1) in (-1, 3) else None


def _head_dim(reshape: ir.Node) -> int | None:
    """Last entry of the target shape: a constant, or the constant last input of a Concat."""
    c = const(reshape.inputs[1])
    if c is not None:
        return int(c[-1]) if c.size == 4 and c[-1] > 0 else None
    cat = prod(reshape.inputs[1], "Concat")
    last = const(cat.inputs[-1]) if cat is not None and len(cat.inputs) == 4 else None
    return int(last.reshape(-1)[-1]) if last is not None and last.size == 1 and last.reshape(-1)[-1] > 0 else None


def _gqa_input(g: ir.Graph, b: _Heads, new: list[ir.Node]) -> ir.Value:
    """What GQA takes for Q or K: the projection, or the head-wise norm reshaped back to 3-D."""
    if b.norm is None:
        return b.proj
    normed = b.norm.outputs[0]
    if b.heads is not None:  # the norm moved before the head transpose, where GQA's input is
        moved = ir.node("SimplifiedLayerNormalization", [b.heads, *b.norm.inputs[1:]],
                        {k: a.value for k, a in b.norm.attributes.items()}, name=f"{b.norm.name}/BeforeTranspose")
        new.append(moved)
        normed = moved.outputs[0]
        normed.type = b.norm.outputs[0].type
    flat = shared_const(g, "gqa/shape_bs_flat", np.array([0, 0, -1], np.int64))
    r = ir.node("Reshape", [normed, flat], name=f"{b.norm.name}/Flatten")
    new.append(r)
    return r.outputs[0]


def _rewrite(g: ir.Graph, m: _Match) -> None:
    import_ms_domain(g)
    seqlens, total = gqa_lengths(g, static=m.static is not None)
    rotary: list[ir.Value | None] = []
    if m.caches is not None:
        rotary = [shared_const(g, "cos_cache", m.caches[0]), shared_const(g, "sin_cache", m.caches[1])]
    new: list[ir.Node] = []
    if m.rope_kept and m.rotated is not None:  # the source's RoPE output, back to [B, S, heads*hd]
        q_in, k_in = (_flatten_heads(g, x, new) for x in m.rotated)
        scale = m.outer_scale  # the factors on Q and K before the RoPE are in the rotated values
    else:
        q_in, k_in = _gqa_input(g, m.q, new), _gqa_input(g, m.k, new)
        scale = m.scale
    rotates = m.caches is not None
    attrs = {"num_heads": m.q.count, "kv_num_heads": m.k.count, "scale": float(scale),
             "do_rotary": int(rotates), "rotary_interleaved": int(bool(rotates and m.rope and m.rope.interleaved))}
    if m.window is not None:  # onnxruntime's CPU kernel, measured: the query sees local_window_size positions
        attrs["local_window_size"] = m.window
    if m.softcap:
        attrs["softcap"] = float(m.softcap)
    node = ir.node("GroupQueryAttention",
                   [q_in, k_in, m.v.proj, m.past_k, m.past_v, seqlens, total, *rotary], attrs,
                   domain=MS, num_outputs=3, name=f"{m.anchor.name}/GroupQueryAttention")
    new.append(node)
    out, present_k, present_v = node.outputs
    out.shape, out.type = m.out.shape, m.out.type
    for p, src in ((present_k, m.k_all), (present_v, m.v_all)):
        p.shape, p.type = src.shape, src.type
    g.insert_after(producer_of(m.out), new)
    replace(m.out, out)
    replace(m.k_all, present_k)
    replace(m.v_all, present_v)


def _flatten_heads(g: ir.Graph, x: ir.Value, new: list[ir.Node]) -> ir.Value:
    """[B, heads, S, hd] -> [B, S, heads*hd], as GQA takes Q and K."""
    t = ir.node("Transpose", [x], {"perm": [0, 2, 1, 3]}, name=f"{x.name}/ToBSNH")
    flat = shared_const(g, "gqa/shape_bs_flat", np.array([0, 0, -1], np.int64))
    r = ir.node("Reshape", [t.outputs[0], flat], name=f"{x.name}/Flatten")
    t.outputs[0].type = r.outputs[0].type = x.type
    new += [t, r]
    return r.outputs[0]


def _float_type(v: ir.Value) -> type:
    """numpy's float type of `v` (fp32 when unknown)."""
    dtype = v.type.dtype if v.type is not None else None
    return np.float16 if dtype == ir.DataType.FLOAT16 else np.float32

"""Eager bidirectional self-attention -> com.microsoft.MultiHeadAttention (the audio encoder's
windowed attention: no KV cache, no RoPE, an additive window mask).

Anchored on Softmax, it walks
    softmax(Q_h @ K_h^T * scale [+ bias]) @ V_h -> Transpose -> Reshape
where X_h = Transpose(Reshape(X, [.., S, heads, hd])) puts the heads before the sequence. Two layouts:
no batch axis (Q [S, H] -> [heads, S, hd], K -> [heads, hd, S]; the zoo's encoder) and batch-first
(Q [B, S, H] -> [B, heads, S, hd]). MultiHeadAttention takes [B, S, H], so the batchless layout gets an
Unsqueeze per input and a Squeeze after. Scalar factors on the scores or on Q/K before the head split
become the `scale` attribute; the additive bias (the block-diagonal window mask) becomes
attention_bias [1|B, 1|heads, S, T], made once per mask and shared by the layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from webbuild.fusion.rule import Miss, Rule
from webbuild.graph.ir import (
    MS,
    attr,
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

# perms from the Reshape output to the MatMul operand, per layout (rank of the head split)
_PERMS = {3: {"qv": [1, 0, 2], "k": [1, 2, 0]}, 4: {"qv": [0, 2, 1, 3], "k": [0, 2, 3, 1]}}


@dataclass
class _Match:
    q: ir.Value        # projections: [S, H] (rank 3 split) or [B, S, H] (rank 4 split)
    k: ir.Value
    v: ir.Value
    bias: ir.Value | None
    out: ir.Value      # the merged attention output the node replaces
    heads: int
    scale: float
    rank: int          # rank of the head split: 3 (no batch axis) or 4
    anchor: ir.Node


def match(sm: ir.Node) -> _Match | Miss:
    scores = sm.inputs[0]
    if scores is None:
        return Miss("Softmax without an input")
    rank = len(scores.shape) if scores.shape is not None else None
    if attr(sm, "axis", -1) not in (-1, (rank or 0) - 1):
        return Miss("Softmax not over the last axis")
    found = _scores(scores)
    if found is None:
        return Miss("Softmax input is not Q @ K^T [* scale] [+ bias]")
    qk, scale, bias = found
    pv = only_user(sm.outputs[0], "MatMul")
    if pv is None or pv.inputs[0] is not sm.outputs[0]:
        return Miss("Softmax output is not multiplied by V")
    q, k, v = (_split(x) for x in (qk.inputs[0], qk.inputs[1], pv.inputs[1]))
    if isinstance(q, Miss) or isinstance(k, Miss) or isinstance(v, Miss):
        return next(b for b in (q, k, v) if isinstance(b, Miss))
    split_rank = len(q.perm)
    perms = _PERMS.get(split_rank)
    if perms is None or q.perm != perms["qv"] or v.perm != perms["qv"] or k.perm != perms["k"]:
        return Miss("Q/K/V are not split into heads as [.., heads, S, hd] (K as [.., heads, hd, S])")
    if not (q.heads == k.heads == v.heads):
        return Miss(f"head counts differ: q {q.heads}, k {k.heads}, v {v.heads}")
    if v.scale != 1.0:
        return Miss("V is scaled before the head split")
    out = _merged(pv.outputs[0], perms["qv"])
    if out is None:
        return Miss("attention output is not transposed and reshaped back to [.., S, heads*hd]")
    if bias is not None and (bias.shape is None or not 2 <= len(bias.shape) <= 4):
        return Miss("additive bias of unknown rank")
    return _Match(q.x, k.x, v.x, bias, out, q.heads, scale * q.scale * k.scale, split_rank, sm)


def _scores(v: ir.Value | None) -> tuple[ir.Node, float, ir.Value | None] | None:
    """(Q @ K^T MatMul, scale, additive bias or None) under an optional Add and scalar Mul/Div."""
    add = prod(v, "Add")
    for s, bias in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])) if add else ((v, None),):
        base, scale = _unscaled(s)
        mm = prod(base, "MatMul")
        if mm is not None and (bias is None or scalar(bias) is None):
            return mm, scale, bias
    return None


def _unscaled(v: ir.Value | None) -> tuple[ir.Value | None, float]:
    """(v without the scalar Mul/Div factors applied last, the product of those factors)."""
    scale = 1.0
    while (n := prod(v, "Mul", "Div")) is not None:
        found = scalar_operand(n)
        if found is None or (n.op_type == "Div" and (found[0] is not n.inputs[0] or not found[1])):
            break
        v, scale = found[0], scale * found[1] if n.op_type == "Mul" else scale / found[1]
    return v, scale


@dataclass
class _Split:
    x: ir.Value     # the projection before the head split
    perm: list[int]
    heads: int
    scale: float    # a scalar factor applied to the projection before the split


def _split(v: ir.Value | None) -> _Split | Miss:
    """Transpose*(Reshape(x [* c], [.., heads, hd])) -> x, composed perm, heads."""
    perm = None
    while (t := prod(v, "Transpose")) is not None:
        p = list(attr(t, "perm", []))
        perm = p if perm is None else [p[i] for i in perm]
        v = t.inputs[0]
    r = prod(v, "Reshape")
    dims = _dims(r.inputs[1]) if r is not None else None
    if r is None or perm is None or dims is None or len(dims) != len(perm) or not dims[-2] or dims[-2] < 1:
        return Miss("Q/K/V are not Transpose(Reshape(x, [.., heads, hd])) with a known head count")
    x, scale = _unscaled(r.inputs[0])
    if x is None or x.shape is None or len(x.shape) != len(perm) - 1:
        return Miss("Q/K/V projections of unknown rank or not [.., S, H]")
    h, hd = width(x), dims[-1]  # hd None: computed at run time, unchecked as -1 is
    if h is not None and (h % dims[-2] or (hd is not None and hd > 0 and hd * dims[-2] != h)):
        return Miss(f"projection width {h} does not split into {dims[-2]} heads of {dims[-1]}")
    return _Split(x, perm, dims[-2], scale)


def _dims(v: ir.Value | None) -> list[int | None] | None:
    """A Reshape target: constant, or a Concat of constant and computed 1-element pieces (None)."""
    c = const(v)
    if c is not None:
        return [int(d) for d in c.reshape(-1)]
    cat = prod(v, "Concat")
    if cat is None:
        return None
    dims: list[int | None] = []
    for piece in cat.inputs:
        pc = const(piece)
        if pc is not None:
            dims += [int(d) for d in pc.reshape(-1)]
        elif piece is not None and piece.shape is not None and list(piece.shape) == [1]:
            dims.append(None)
        else:
            return None
    return dims


def _merged(v: ir.Value, perm: list[int]) -> ir.Value | None:
    t = only_user(v, "Transpose")
    if t is None or list(attr(t, "perm", [])) != perm:  # these perms are their own inverses
        return None
    r = only_user(t.outputs[0], "Reshape")
    return r.outputs[0] if r is not None else None


def _rewrite(g: ir.Graph, m: _Match) -> None:
    import_ms_domain(g)
    name = m.anchor.name or "attention"
    axis0 = shared_const(g, "encoder_attention/axis0", np.array([0], np.int64))
    ins = [m.q, m.k, m.v]
    if m.rank == 3:
        ins = [_unsqueezed(g, x, axis0, f"{name}/Unsqueeze{i}") for i, x in enumerate(ins)]
    bias = _attention_bias(g, m.bias, name) if m.bias is not None else None
    node = ir.node("MultiHeadAttention", [*ins, None, None, bias] if bias is not None else ins,
                   {"num_heads": m.heads, "scale": float(m.scale)}, domain=MS,
                   name=f"{name}/MultiHeadAttention")
    g.insert_after(producer_of(m.out), node)
    out = node.outputs[0]
    out.type = m.out.type
    if m.rank == 3:
        sq = ir.node("Squeeze", [out, axis0], name=f"{name}/Squeeze")
        g.insert_after(node, sq)
        out = sq.outputs[0]
    out.shape, out.type = m.out.shape, m.out.type
    replace(m.out, out)


def _attention_bias(g: ir.Graph, bias: ir.Value, name: str) -> ir.Value:
    """bias [.., S, T] -> [1.., S, T] of rank 4, once per bias value."""
    assert bias.shape is not None, "match leaves biases of unknown rank"
    if len(bias.shape) == 4:
        return bias
    new_axes = 4 - len(bias.shape)
    axes = shared_const(g, f"encoder_attention/axes{new_axes}", np.arange(new_axes, dtype=np.int64))
    return _unsqueezed(g, bias, axes, f"{name}/attention_bias")


def _unsqueezed(g: ir.Graph, x: ir.Value, axes: ir.Value, name: str) -> ir.Value:
    """Unsqueeze(x, axes), made once per x (a later layer takes an earlier one's) right after x's
    producer (or first). `axes` is this rule's own initializer, so the Unsqueeze found is one it made."""
    made = next((u for u in x.consumers() if u.op_type == "Unsqueeze" and u.inputs[1] is axes), None)
    if made is None:
        made = ir.node("Unsqueeze", [x, axes], name=name)
        p = x.producer()
        g.insert_after(p, made) if p is not None else g.insert_before(g.node(0), made)
    return made.outputs[0]


RULE = Rule("encoder_attention", ("Softmax",), match, _rewrite)

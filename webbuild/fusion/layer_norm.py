"""Decomposed LayerNorm -> LayerNormalization (opset >= 17; stash_type=1: statistics in fp32).

Exports at opset 17+ usually emit LayerNormalization already; older or hand-written graphs spell
    d = x - ReduceMean(x); y = d / Sqrt(ReduceMean(d^2) + eps) [* gamma] [+ beta]
over the last axis, the square as Pow(d, 2) or Mul(d, d), the division as Div, Mul(Reciprocal) or Mul(Div(1, .)).
Anchored on the ReduceMean of x (the one a Sub subtracts from x).

Structural, not an onnxscript pattern, for the reasons rms_norm gives: the spellings, an optional
scale and shift at the output, and a report of near misses at the ReduceMean they start from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from webbuild.fusion.norm_parts import sqrt_plus_eps
from webbuild.fusion.rule import Miss, Rule
from webbuild.graph.ir import attr, axes_of, const, new_const, only_user, other, producer_of, replace, scalar

MIN_OPSET = 17


@dataclass
class _Match:
    x: ir.Value
    eps: float
    gamma: ir.Value | None
    beta: ir.Value | None
    out: ir.Value
    anchor: ir.Node


def _centering(rm: ir.Node) -> ir.Node | None:
    """The Sub(x, mean) that makes `rm` the mean of a LayerNorm."""
    x = rm.inputs[0]
    mean = rm.outputs[0]
    subs = [n for n in mean.consumers() if n.op_type == "Sub" and n.inputs[0] is x and n.inputs[1] is mean]
    return subs[0] if len(subs) == 1 else None


def match(rm: ir.Node) -> _Match | Miss | None:
    sub = _centering(rm)
    if sub is None:
        return None  # the variance's ReduceMean, or another mean
    x, d = rm.inputs[0], sub.outputs[0]
    if x is None:
        return None
    rank = len(x.shape) if x.shape is not None else None
    last = [[-1]] + ([[rank - 1]] if rank else [])
    if attr(rm, "keepdims", 1) != 1 or axes_of(rm) not in last:
        return Miss("mean not over the last axis with keepdims")
    var = _variance(d)
    if var is None or attr(var, "keepdims", 1) != 1 or axes_of(var) not in last:
        return Miss("no ReduceMean((x - mean)^2) over the last axis")
    root = sqrt_plus_eps(var.outputs[0])
    if root is None:
        return Miss("no Sqrt(variance + eps)")
    normed = _divided(d, root[1].outputs[0])
    if normed is None:
        return Miss("x - mean is not divided by the standard deviation")
    gamma, out = _affine(normed, "Mul")
    beta, out = _affine(out, "Add")
    if gamma is None and (x.shape is None or not isinstance(x.shape[-1], int)):
        return Miss("no scale and the normalised width is unknown")
    opset = rm.graph.opset_imports.get("") if rm.graph is not None else None
    if (opset or 0) < MIN_OPSET:
        return Miss(f"opset {opset} < {MIN_OPSET}: no LayerNormalization")
    return _Match(x, root[0], gamma, beta, out, rm)


def _variance(d: ir.Value) -> ir.Node | None:
    for n in d.consumers():
        sq = n.op_type == "Pow" and n.inputs[0] is d and scalar(n.inputs[1]) == 2.0
        sq = sq or (n.op_type == "Mul" and n.inputs[0] is d and n.inputs[1] is d)
        rm = only_user(n.outputs[0], "ReduceMean") if sq else None
        if rm is not None:
            return rm
    return None


def _divided(d: ir.Value, std: ir.Value) -> ir.Value | None:
    """d / std as Div(d, std), or Mul(d, 1 / std) with 1 / std a Reciprocal or Div(1, std)."""
    n = only_user(std, "Div", "Reciprocal")
    if n is None:
        return None
    if n.op_type == "Div" and n.inputs[0] is d:
        return n.outputs[0]
    if n.op_type == "Div" and not (n.inputs[1] is std and scalar(n.inputs[0]) == 1.0):
        return None
    mul = only_user(n.outputs[0], "Mul")
    return mul.outputs[0] if mul is not None and other(mul, n.outputs[0]) is d else None


def _affine(v: ir.Value, op: str) -> tuple[ir.Value | None, ir.Value]:
    """(1-D constant, result) of an elementwise `op` with a constant vector after v, else (None, v)."""
    n = only_user(v, op)
    c = other(n, v) if n is not None else None
    w = const(c)
    if n is not None and w is not None and w.ndim == 1:
        return c, n.outputs[0]
    return None, v


def _rewrite(g: ir.Graph, m: _Match) -> None:
    gamma = m.gamma
    if gamma is None:  # LayerNormalization needs a scale; ones keep the math
        width = m.x.shape[-1] if m.x.shape is not None else None
        assert isinstance(width, int), "match checked the width"
        gamma = new_const(g, "layer_norm.ones", np.ones(width, np.float32))
    ins = [m.x, gamma] + ([m.beta] if m.beta is not None else [])
    node = ir.node("LayerNormalization", ins, {"axis": -1, "epsilon": m.eps, "stash_type": 1},
                   name=f"{m.anchor.name}/LayerNorm")
    node.outputs[0].shape, node.outputs[0].type = m.out.shape, m.out.type
    g.insert_after(producer_of(m.out), node)
    replace(m.out, node.outputs[0])


RULE = Rule("layer_norm", ("ReduceMean",), match, _rewrite)

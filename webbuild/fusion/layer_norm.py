"""Decomposed LayerNorm -> LayerNormalization (opset >= 17; stash_type=1: statistics in fp32).

Exports at opset 17+ usually emit LayerNormalization already; older or hand-written graphs spell
    d = x - ReduceMean(x); y = d / Sqrt(ReduceMean(d^2) + eps) [* gamma] [+ beta]
over the last axis, the square as Pow(d, 2) or Mul(d, d), the division as Div or Mul(Reciprocal).
Anchored on the ReduceMean of x (the one a Sub subtracts from x).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from webbuild.graph.ir import attr, axes_of, const, new_const, only_user, other, replace, scalar, scalar_operand
from webbuild.fusion.report import Report

RULE = "layer_norm"
MIN_OPSET = 17


@dataclass
class _Match:
    x: ir.Value
    eps: float
    gamma: ir.Value | None
    beta: ir.Value | None
    out: ir.Value
    anchor: ir.Node


def apply(model: ir.Model, report: Report) -> int:
    g, done = model.graph, 0
    for rm in [n for n in g if n.op_type == "ReduceMean"]:
        sub = _centering(rm)
        if sub is None:
            continue  # the variance's ReduceMean, or another mean
        m = match(rm, sub)
        if isinstance(m, str):
            report.miss(RULE, rm.name or "ReduceMean", m)
            continue
        if g.opset_imports.get("", 0) < MIN_OPSET:
            opset = g.opset_imports.get("")
            report.miss(RULE, rm.name or "ReduceMean", f"opset {opset} < {MIN_OPSET}: no LayerNormalization")
            continue
        _rewrite(g, m)
        done += 1
    report.hit(RULE, done) if done else None
    return done


def _centering(rm: ir.Node) -> ir.Node | None:
    """The Sub(x, mean) that makes `rm` the mean of a LayerNorm."""
    x = rm.inputs[0]
    mean = rm.outputs[0]
    subs = [n for n in mean.consumers() if n.op_type == "Sub" and n.inputs[0] is x and n.inputs[1] is mean]
    return subs[0] if len(subs) == 1 else None


def match(rm: ir.Node, sub: ir.Node) -> _Match | str:
    x, d = rm.inputs[0], sub.outputs[0]
    rank = len(x.shape) if x.shape is not None else None
    last = [[-1]] + ([[rank - 1]] if rank else [])
    if attr(rm, "keepdims", 1) != 1 or axes_of(rm) not in last:
        return "mean not over the last axis with keepdims"
    var = _variance(d)
    if var is None or attr(var, "keepdims", 1) != 1 or axes_of(var) not in last:
        return "no ReduceMean((x - mean)^2) over the last axis"
    add = only_user(var.outputs[0], "Add")
    eps = scalar_operand(add) if add is not None else None
    sqrt = only_user(add.outputs[0], "Sqrt") if eps else None
    if sqrt is None:
        return "no Sqrt(variance + eps)"
    normed = _divided(d, sqrt.outputs[0])
    if normed is None:
        return "x - mean is not divided by the standard deviation"
    gamma, out = _affine(normed, "Mul")
    beta, out = _affine(out, "Add")
    if gamma is None and (x.shape is None or not isinstance(x.shape[-1], int)):
        return "no scale and the normalised width is unknown"
    return _Match(x, eps[1], gamma, beta, out, rm)


def _variance(d: ir.Value) -> ir.Node | None:
    for n in d.consumers():
        sq = n.op_type == "Pow" and n.inputs[0] is d and scalar(n.inputs[1]) == 2.0
        sq = sq or (n.op_type == "Mul" and n.inputs[0] is d and n.inputs[1] is d)
        rm = only_user(n.outputs[0], "ReduceMean") if sq else None
        if rm is not None:
            return rm
    return None


def _divided(d: ir.Value, std: ir.Value) -> ir.Value | None:
    """d / std as Div(d, std) or Mul(d, Reciprocal(std))."""
    n = only_user(std, "Div", "Reciprocal")
    if n is None:
        return None
    if n.op_type == "Div":
        return n.outputs[0] if n.inputs[0] is d else None
    mul = only_user(n.outputs[0], "Mul")
    return mul.outputs[0] if mul is not None and other(mul, n.outputs[0]) is d else None


def _affine(v: ir.Value, op: str) -> tuple[ir.Value | None, ir.Value]:
    """(1-D constant, result) of an elementwise `op` with a constant vector after v, else (None, v)."""
    n = only_user(v, op)
    c = other(n, v) if n is not None else None
    if c is not None and const(c) is not None and const(c).ndim == 1:
        return c, n.outputs[0]
    return None, v


def _rewrite(g: ir.Graph, m: _Match) -> None:
    gamma = m.gamma
    if gamma is None:  # LayerNormalization needs a scale; ones keep the math
        gamma = new_const(g, "layer_norm.ones", np.ones(int(m.x.shape[-1]), np.float32))
    ins = [m.x, gamma] + ([m.beta] if m.beta is not None else [])
    node = ir.node("LayerNormalization", ins, {"axis": -1, "epsilon": m.eps, "stash_type": 1},
                   name=f"{m.anchor.name}/LayerNorm")
    node.outputs[0].shape, node.outputs[0].type = m.out.shape, m.out.type
    g.insert_after(m.out.producer(), node)
    replace(m.out, node.outputs[0])

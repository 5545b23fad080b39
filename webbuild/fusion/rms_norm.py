"""RMSNorm -> SimplifiedLayerNormalization (stash_type=1: statistics in fp32).

Anchored on ReduceMean over the last axis, it accepts the spellings the exporters emit:
square as Pow(x, 2) or Mul(x, x); x * Div(1, Sqrt(m + eps)) (torchscript), x * Reciprocal(Sqrt(..))
(dynamo) or Div(x, Sqrt(..)); an optional weight Mul in either operand order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from webbuild.graph.ir import attr, axes_of, const, new_const, only_user, other, prod, replace, scalar, scalar_operand
from webbuild.fusion.report import Report

RULE = "rms_norm"


@dataclass
class _Match:
    x: ir.Value
    eps: float
    weight: ir.Value | None
    out: ir.Value  # the value the fused node replaces
    anchor: ir.Node


def apply(model: ir.Model, report: Report) -> int:
    g, done = model.graph, 0
    for rm in [n for n in g if n.op_type == "ReduceMean"]:
        m = match(rm)
        if isinstance(m, str):
            report.miss(RULE, rm.name or "ReduceMean", m)
            continue
        _rewrite(g, m)
        done += 1
    report.hit(RULE, done) if done else None
    return done


def match(rm: ir.Node) -> _Match | str:
    if attr(rm, "keepdims", 1) != 1:
        return "ReduceMean without keepdims"
    sq = prod(rm.inputs[0], "Pow", "Mul")
    if sq is None:
        return "ReduceMean input is not a square"
    x = sq.inputs[0]
    if sq.op_type == "Pow" and scalar(sq.inputs[1]) != 2.0 or sq.op_type == "Mul" and sq.inputs[1] is not x:
        return "ReduceMean input is not x*x"
    rank = len(x.shape) if x.shape is not None else None
    if axes_of(rm) not in ([-1], [rank - 1] if rank else [-1]):
        return "not a reduction over the last axis"
    add = only_user(rm.outputs[0], "Add")
    eps_op = scalar_operand(add) if add is not None else None
    sqrt = only_user(add.outputs[0], "Sqrt") if eps_op else None
    if sqrt is None:
        return "no Add(eps) -> Sqrt after the mean"
    normed = _normalized(x, sqrt)
    if normed is None:
        return "x is not scaled by 1/sqrt(mean + eps)"
    weight, out = _weight(normed)
    if weight is not None and const(weight).ndim != 1:
        return "weight is not a vector"
    return _Match(x, eps_op[1], weight, out, rm)


def _normalized(x: ir.Value, sqrt: ir.Node) -> ir.Value | None:
    """The value x / sqrt(...) for the three spellings, or None."""
    s = sqrt.outputs[0]
    nxt = only_user(s, "Reciprocal", "Div")
    if nxt is None:
        return None
    if nxt.op_type == "Div" and nxt.inputs[0] is x:  # x / sqrt
        return nxt.outputs[0]
    if nxt.op_type == "Div" and scalar(nxt.inputs[0]) != 1.0:
        return None
    mul = only_user(nxt.outputs[0], "Mul")
    return mul.outputs[0] if mul is not None and other(mul, nxt.outputs[0]) is x else None


def _weight(normed: ir.Value) -> tuple[ir.Value | None, ir.Value]:
    mul = only_user(normed, "Mul")
    if mul is not None:
        w = other(mul, normed)
        if const(w) is not None:
            return w, mul.outputs[0]
    return None, normed


def _rewrite(g: ir.Graph, m: _Match) -> None:
    weight = m.weight
    if weight is None:  # SimplifiedLayerNormalization needs a scale; ones keep the math
        dim = m.x.shape[-1] if m.x.shape is not None else None
        weight = new_const(g, "rms_norm.ones", np.ones(int(dim), np.float32))
    node = ir.node("SimplifiedLayerNormalization", [m.x, weight],
                   {"axis": -1, "epsilon": m.eps, "stash_type": 1}, name=f"{m.anchor.name}/SimplifiedLayerNorm")
    node.outputs[0].shape, node.outputs[0].type = m.out.shape, m.out.type
    g.insert_after(m.out.producer(), node)
    replace(m.out, node.outputs[0])

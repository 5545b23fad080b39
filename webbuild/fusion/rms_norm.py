"""RMSNorm -> SimplifiedLayerNormalization (stash_type=1: statistics in fp32).

Anchored on ReduceMean over the last axis, it accepts the spellings the exporters emit:
square as Pow(x, 2) or Mul(x, x); x * Div(1, Sqrt(m + eps)) (torchscript), x * Reciprocal(Sqrt(..))
(dynamo) or Div(x, Sqrt(..)); an optional weight Mul in either operand order.

Structural, not an onnxscript pattern: these spellings, the optional trailing weight Mul (a pattern's
output cannot be optional) and commuted operands would take a dozen pattern variants, and the rule
anchors at ReduceMean, the start of the spelling, to report where and why a near miss was not fused.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from webbuild.fusion.norm_parts import sqrt_plus_eps
from webbuild.fusion.rule import Miss, Rule
from webbuild.graph.ir import attr, axes_of, const, new_const, only_user, other, prod, producer_of, replace, scalar


@dataclass
class _Match:
    x: ir.Value
    eps: float
    weight: ir.Value | None
    out: ir.Value  # the value the fused node replaces
    anchor: ir.Node


def match(rm: ir.Node) -> _Match | Miss:
    if attr(rm, "keepdims", 1) != 1:
        return Miss("ReduceMean without keepdims")
    sq = prod(rm.inputs[0], "Pow", "Mul")
    if sq is None:
        return Miss("ReduceMean input is not a square")
    x = sq.inputs[0]
    if x is None:
        return Miss("ReduceMean input is not x*x")
    if sq.op_type == "Pow" and scalar(sq.inputs[1]) != 2.0 or sq.op_type == "Mul" and sq.inputs[1] is not x:
        return Miss("ReduceMean input is not x*x")
    rank = len(x.shape) if x.shape is not None else None
    if axes_of(rm) not in ([-1], [rank - 1] if rank else [-1]):
        return Miss("not a reduction over the last axis")
    root = sqrt_plus_eps(rm.outputs[0])
    if root is None:
        return Miss("no Add(eps) -> Sqrt after the mean")
    normed = _normalized(x, root[1])
    if normed is None:
        return Miss("x is not scaled by 1/sqrt(mean + eps)")
    weight, out = _weight(normed)
    if weight is not None and (w := const(weight)) is not None and w.ndim != 1:
        return Miss("weight is not a vector")
    if weight is None and (x.shape is None or not isinstance(x.shape[-1], int)):
        return Miss("no weight and the normalised width is unknown")
    return _Match(x, root[0], weight, out, rm)


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
        assert isinstance(dim, int), "match checked the width"
        weight = new_const(g, "rms_norm.ones", np.ones(dim, np.float32))
    node = ir.node("SimplifiedLayerNormalization", [m.x, weight],
                   {"axis": -1, "epsilon": m.eps, "stash_type": 1}, name=f"{m.anchor.name}/SimplifiedLayerNorm")
    node.outputs[0].shape, node.outputs[0].type = m.out.shape, m.out.type
    g.insert_after(producer_of(m.out), node)
    replace(m.out, node.outputs[0])


RULE = Rule("rms_norm", ("ReduceMean",), match, _rewrite)

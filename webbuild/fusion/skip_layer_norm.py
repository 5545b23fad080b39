"""Residual Add + LayerNormalization -> com.microsoft.SkipLayerNormalization.

The residual sum leaves through output 3, so the next residual Add chains from it. When one side of
the Add ends in a linear layer's bias (the attention output projection, the second MLP layer), the
bias moves into the op's `bias` input (see linear_bias). Only an Add of two computed tensors of equal
rank counts as a residual (a constant operand is a bias, a broadcast is something else).
Matched with an onnxscript pattern (see fusion.rule).
"""

from __future__ import annotations

import onnx_ir as ir

from webbuild.fusion import linear_bias
from webbuild.fusion.norm_parts import Residual, fold_residual, match_residual
from webbuild.fusion.rule import Miss, Rule
from webbuild.graph.ir import attr, const


def match(ln: ir.Node) -> Residual | Miss | None:
    m = match_residual("LayerNormalization", ln)
    if m is None:
        return None  # a norm with no residual before it (the first layer's): nothing to fold
    why = _unfit(ln, m.add)
    return Miss(why) if why else m


def _unfit(ln: ir.Node, add: ir.Node) -> str | None:
    a, b = add.inputs
    if const(a) is not None or const(b) is not None:
        return "Add has a constant operand"
    if a is None or b is None or a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return "Add operands of unknown or different rank"
    rank = len(a.shape)
    if attr(ln, "axis", -1) not in (-1, rank - 1):
        return "not normalised over the last axis"
    if any(o.consumers() or o.is_graph_output() for o in ln.outputs[1:]):
        return "mean / inverse std-dev outputs are used"
    return None


def _rewrite(g: ir.Graph, m: Residual) -> None:
    inputs, bias = list(m.add.inputs), None
    for i, v in enumerate(inputs):
        found = linear_bias.find(v, m.add)
        if found is not None:
            inputs[i], bias = linear_bias.take(g, found), found.bias
            break
    beta = m.norm.inputs[2] if len(m.norm.inputs) > 2 else None
    ins = [*inputs, m.norm.inputs[1], beta, bias]
    while ins[-1] is None:
        ins.pop()
    fold_residual(g, m, "SkipLayerNormalization", ins)


RULE = Rule("skip_layer_norm", ("LayerNormalization",), match, _rewrite, domain="")

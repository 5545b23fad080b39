"""Residual Add + LayerNormalization -> com.microsoft.SkipLayerNormalization.

The residual sum leaves through output 3, so the next residual Add chains from it. When one side of
the Add ends in a linear layer's bias (the attention output projection, the second MLP layer), the
bias moves into the op's `bias` input (see linear_bias). Only an Add of two computed tensors of equal
rank counts as a residual (a constant operand is a bias, a broadcast is something else).
"""

from __future__ import annotations

import onnx_ir as ir

from webbuild.fusion import linear_bias
from webbuild.graph.ir import MS, attr, const, import_ms_domain, prod, replace
from webbuild.fusion.report import Report

RULE = "skip_layer_norm"


def apply(model: ir.Model, report: Report) -> int:
    g, done = model.graph, 0
    for ln in [n for n in g if n.op_type == "LayerNormalization" and n.domain == ""]:
        add = prod(ln.inputs[0], "Add")
        if add is None:
            continue  # a norm with no residual before it (the first layer's): nothing to fold
        why = _unfit(ln, add)
        if why:
            report.miss(RULE, ln.name or "LayerNormalization", why)
            continue
        _rewrite(g, ln, add)
        done += 1
    report.hit(RULE, done) if done else None
    return done


def _unfit(ln: ir.Node, add: ir.Node) -> str | None:
    a, b = add.inputs
    if const(a) is not None or const(b) is not None:
        return "Add has a constant operand"
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return "Add operands of unknown or different rank"
    rank = len(a.shape)
    if attr(ln, "axis", -1) not in (-1, rank - 1):
        return "not normalised over the last axis"
    if any(o.consumers() or o.is_graph_output() for o in ln.outputs[1:]):
        return "mean / inverse std-dev outputs are used"
    return None


def _rewrite(g: ir.Graph, ln: ir.Node, add: ir.Node) -> None:
    import_ms_domain(g)
    inputs, bias = list(add.inputs), None
    for i, v in enumerate(inputs):
        found = linear_bias.find(v, add)
        if found is not None:
            inputs[i], bias = linear_bias.take(g, found), found.bias
            break
    gamma = ln.inputs[1]
    beta = ln.inputs[2] if len(ln.inputs) > 2 else None
    ins = [*inputs, gamma, beta, bias]
    while ins[-1] is None:
        ins.pop()
    node = ir.node("SkipLayerNormalization", ins,
                   {"epsilon": attr(ln, "epsilon", 1e-5)}, domain=MS, num_outputs=4,
                   name=(ln.name or "norm") + "/Skip")
    y, _, _, total = node.outputs
    y.shape, y.type = ln.outputs[0].shape, ln.outputs[0].type
    total.shape, total.type = add.outputs[0].shape, add.outputs[0].type
    g.insert_after(ln, node)
    replace(ln.outputs[0], y)
    replace(add.outputs[0], total)

"""Residual Add + SimplifiedLayerNormalization -> com.microsoft.SkipSimplifiedLayerNormalization.

The residual sum leaves through output 3, so the next layer's Add (and its norm) chains from it.
Only an Add of two computed tensors counts as a residual (a constant operand is a bias).
"""

from __future__ import annotations

import onnx_ir as ir

from webbuild.graph.ir import MS, attr, const, import_ms_domain, prod, replace
from webbuild.fusion.report import Report

RULE = "skip_rms_norm"


def apply(model: ir.Model, report: Report) -> int:
    g, done = model.graph, 0
    for sln in [n for n in g if n.op_type == "SimplifiedLayerNormalization" and n.domain == ""]:
        add = prod(sln.inputs[0], "Add")
        if add is None:
            continue  # a plain norm (first layer, Q/K norm): nothing to fold
        a, b = add.inputs[0], add.inputs[1]
        if const(a) is not None or const(b) is not None:
            report.miss(RULE, sln.name or "SimplifiedLayerNormalization", "Add has a constant operand")
            continue
        if a.shape is not None and b.shape is not None and len(a.shape) != len(b.shape):
            report.miss(RULE, sln.name or "SimplifiedLayerNormalization", "broadcasting Add")
            continue
        _rewrite(g, sln, add)
        done += 1
    report.hit(RULE, done) if done else None
    return done


def _rewrite(g: ir.Graph, sln: ir.Node, add: ir.Node) -> None:
    import_ms_domain(g)
    node = ir.node("SkipSimplifiedLayerNormalization", [add.inputs[0], add.inputs[1], sln.inputs[1]],
                   {"epsilon": attr(sln, "epsilon", 1e-5)}, domain=MS, num_outputs=4,
                   name=(sln.name or "norm") + "/Skip")
    y, _, _, total = node.outputs
    y.shape, y.type = sln.outputs[0].shape, sln.outputs[0].type
    total.shape, total.type = add.outputs[0].shape, add.outputs[0].type
    g.insert_after(sln, node)
    replace(sln.outputs[0], y)
    replace(add.outputs[0], total)

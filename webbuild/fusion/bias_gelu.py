"""Linear bias + Gelu -> com.microsoft.BiasGelu(x, bias): the bias is added inside the activation.

Runs after `gelu`. The bias is an Add of a constant vector or the C of a Gemm (see linear_bias); a
Gelu with no linear bias before it (after a Conv, whose bias is its own) stays a Gelu.
"""

from __future__ import annotations

import onnx_ir as ir

from webbuild.fusion import linear_bias
from webbuild.graph.ir import MS, replace
from webbuild.fusion.report import Report

RULE = "bias_gelu"


def apply(model: ir.Model, report: Report) -> int:
    g, done = model.graph, 0
    for gelu in [n for n in g if n.op_type == "Gelu" and n.domain == MS]:
        b = linear_bias.find(gelu.inputs[0], gelu)
        if b is None:
            continue
        x = linear_bias.take(g, b)
        node = ir.node("BiasGelu", [x, b.bias], domain=MS, name=f"{gelu.name}/Bias")
        out = gelu.outputs[0]
        node.outputs[0].shape, node.outputs[0].type = out.shape, out.type
        g.insert_after(gelu, node)
        replace(out, node.outputs[0])
        done += 1
    report.hit(RULE, done) if done else None
    return done

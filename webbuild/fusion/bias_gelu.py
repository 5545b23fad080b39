"""Linear bias + Gelu -> com.microsoft.BiasGelu(x, bias): the bias is added inside the activation.

Runs after `gelu`. The bias is an Add of a constant vector or the C of a Gemm (see linear_bias); a
Gelu with no linear bias before it (after a Conv, whose bias is its own) stays a Gelu.
Structural, not an onnxscript pattern: what a linear layer's bias looks like is linear_bias's to
say, for this rule and skip_layer_norm alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from webbuild.fusion import linear_bias
from webbuild.fusion.rule import Rule
from webbuild.graph.ir import MS, replace


@dataclass
class _Match:
    gelu: ir.Node
    bias: linear_bias.Bias


def match(gelu: ir.Node) -> _Match | None:
    b = linear_bias.find(gelu.inputs[0], gelu)
    return _Match(gelu, b) if b is not None else None


def _rewrite(g: ir.Graph, m: _Match) -> None:
    x = linear_bias.take(g, m.bias)
    node = ir.node("BiasGelu", [x, m.bias.bias], domain=MS, name=f"{m.gelu.name}/Bias")
    out = m.gelu.outputs[0]
    node.outputs[0].shape, node.outputs[0].type = out.shape, out.type
    g.insert_after(m.gelu, node)
    replace(out, node.outputs[0])


RULE = Rule("bias_gelu", ("Gelu",), match, _rewrite, domain=MS)

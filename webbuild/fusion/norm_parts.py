"""What the norm rules share: the `Sqrt(statistic + eps)` under a norm's denominator (rms_norm,
layer_norm), and the residual fold into a Skip norm (skip_rms_norm, skip_layer_norm): norm(Add(a, b))
-> Skip<norm>(a, b, ..) whose output 3 carries the sum on to the next layer's residual Add."""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir
from onnxscript.rewriter import pattern

from webbuild.fusion.rule import pattern_match
from webbuild.graph.ir import MS, attr, import_ms_domain, only_user, replace, scalar_operand


def sqrt_plus_eps(statistic: ir.Value) -> tuple[float, ir.Node] | None:
    """(eps, the Sqrt node) of Sqrt(statistic + eps), the statistic's only use, or None."""
    add = only_user(statistic, "Add")
    eps = scalar_operand(add) if add is not None else None
    sqrt = only_user(add.outputs[0], "Sqrt") if add is not None and eps else None
    return (eps[1], sqrt) if eps is not None and sqrt is not None else None


@dataclass
class Residual:
    norm: ir.Node
    add: ir.Node  # the residual Add feeding the norm


def residual_pattern(norm_op: str) -> pattern.Pattern:
    """norm_op(Add(a, b), scale, ..) in the default domain, as an onnxscript pattern."""
    def target(op, a, b, scale):
        return getattr(op, norm_op)(op.Add(a, b, _outputs=["total"]), scale, _allow_other_inputs=True)
    return pattern.Pattern(target)


def match_residual(norm_op: str, norm: ir.Node) -> Residual | None:
    """`norm` (a `norm_op` node) with the residual Add before it, or None. The pattern is made per call:
    onnxscript's matcher keeps the last graph it matched, so a pattern kept in a module would hold a
    whole model (its weights: 1.4 GB for the 0.6b) for as long as the process lives."""
    found = pattern_match(residual_pattern(norm_op), norm)
    return Residual(norm, found.bindings["total"].producer()) if found is not None else None


def fold_residual(g: ir.Graph, m: Residual, op: str, inputs: list[ir.Value | None]) -> None:
    """Replace the norm and the residual sum with com.microsoft `op`(inputs)'s outputs 0 and 3."""
    import_ms_domain(g)
    norm, add = m.norm, m.add
    node = ir.node(op, inputs, {"epsilon": attr(norm, "epsilon", 1e-5)}, domain=MS, num_outputs=4,
                   name=(norm.name or "norm") + "/Skip")
    y, _, _, total = node.outputs
    y.shape, y.type = norm.outputs[0].shape, norm.outputs[0].type
    total.shape, total.type = add.outputs[0].shape, add.outputs[0].type
    g.insert_after(norm, node)
    replace(norm.outputs[0], y)
    replace(add.outputs[0], total)

"""Residual Add + SimplifiedLayerNormalization -> com.microsoft.SkipSimplifiedLayerNormalization.

The residual sum leaves through output 3, so the next layer's Add (and its norm) chains from it.
Only an Add of two computed tensors counts as a residual (a constant operand is a bias).
Matched with an onnxscript pattern (see fusion.rule).
"""

from __future__ import annotations

import onnx_ir as ir

from webbuild.fusion.norm_parts import Residual, fold_residual, match_residual
from webbuild.fusion.rule import Miss, Rule
from webbuild.graph.ir import const


def match(sln: ir.Node) -> Residual | Miss | None:
    m = match_residual("SimplifiedLayerNormalization", sln)
    if m is None:
        return None  # a plain norm (first layer, Q/K norm): nothing to fold
    a, b = m.add.inputs
    if const(a) is not None or const(b) is not None:
        return Miss("Add has a constant operand")
    if a is not None and b is not None and a.shape is not None and b.shape is not None and len(a.shape) != len(b.shape):
        return Miss("broadcasting Add")
    return m


def _rewrite(g: ir.Graph, m: Residual) -> None:
    fold_residual(g, m, "SkipSimplifiedLayerNormalization", [*m.add.inputs, m.norm.inputs[1]])


RULE = Rule("skip_rms_norm", ("SimplifiedLayerNormalization",), match, _rewrite, domain="")

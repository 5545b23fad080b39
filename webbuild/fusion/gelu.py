"""Exact GELU spelt with Erf -> com.microsoft.Gelu.

Anchored on Erf, it accepts x * 0.5 * (1 + erf(x / sqrt(2))) in the orders the exporters emit:
(x * (1 + erf)) * 0.5 (torchscript), x * (0.5 * (1 + erf)) (dynamo), (x * 0.5) * (1 + erf); the
scaling inside erf as Div(x, sqrt(2)) or Mul(x, 1/sqrt(2)), constants within a relative 1e-5.

Structural, not an onnxscript pattern: three association orders, two spellings of the scaling and
commuted operands make dozens of pattern variants (onnxscript's own erfgelu rule covers two), and
the rule anchors at Erf to report a near miss (e.g. a factor other than 0.5) where it stands.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import onnx_ir as ir

from webbuild.fusion.rule import Miss, Rule
from webbuild.graph.ir import MS, import_ms_domain, only_user, other, prod, producer_of, replace, scalar, scalar_operand


@dataclass
class _Match:
    x: ir.Value
    out: ir.Value  # the value GELU(x) replaces
    anchor: ir.Node


def match(erf: ir.Node) -> _Match | Miss:
    x = _erf_argument(erf)
    if x is None:
        return Miss("Erf input is not x / sqrt(2)")
    add = only_user(erf.outputs[0], "Add")
    one = scalar_operand(add) if add is not None else None
    if add is None or one is None or not _near(one[1], 1.0):
        return Miss("no 1 + erf(..)")
    out = _times_half_x(add.outputs[0], x)
    return _Match(x, out, erf) if out is not None else Miss("1 + erf(..) is not multiplied by 0.5 * x")


def _erf_argument(erf: ir.Node) -> ir.Value | None:
    n = prod(erf.inputs[0], "Div", "Mul")
    found = scalar_operand(n) if n is not None else None
    if n is None or found is None:
        return None
    x, c = found
    if n.op_type == "Div":
        return x if n.inputs[0] is x and _near(c, math.sqrt(2)) else None
    return x if _near(c, 1 / math.sqrt(2)) else None


def _times_half_x(v: ir.Value, x: ir.Value) -> ir.Value | None:
    """The product x * 0.5 * v in any association, starting from v's Mul."""
    m1 = only_user(v, "Mul")
    if m1 is None:
        return None
    o = other(m1, v)
    if o is x:  # (x * v) * 0.5
        m2 = only_user(m1.outputs[0], "Mul")
        half = scalar_operand(m2) if m2 is not None else None
        return m2.outputs[0] if m2 is not None and half is not None and _near(half[1], 0.5) else None
    if _near(scalar(o), 0.5):  # x * (0.5 * v)
        m2 = only_user(m1.outputs[0], "Mul")
        return m2.outputs[0] if m2 is not None and other(m2, m1.outputs[0]) is x else None
    xh = prod(o, "Mul")  # (x * 0.5) * v
    half = scalar_operand(xh) if xh is not None else None
    return m1.outputs[0] if half is not None and half[0] is x and _near(half[1], 0.5) else None


def _near(a: float | None, b: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=1e-5)


def _rewrite(g: ir.Graph, m: _Match) -> None:
    import_ms_domain(g)
    node = ir.node("Gelu", [m.x], domain=MS, name=f"{m.anchor.name or 'erf'}/Gelu")
    node.outputs[0].shape, node.outputs[0].type = m.out.shape, m.out.type
    g.insert_after(producer_of(m.out), node)
    replace(m.out, node.outputs[0])


RULE = Rule("gelu", ("Erf",), match, _rewrite)

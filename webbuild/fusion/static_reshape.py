"""Reshape targets computed from Shape/Gather/Concat -> constants using 0 ("copy this dim").

torchscript spells view(*x.shape[:-1], -1, hd) as Shape -> Gather -> Unsqueeze -> Concat per
Reshape (~6 nodes per layer that survive constant folding because batch and sequence are
symbolic). When each computed entry reads the same axis of a tensor whose leading axes provably
equal the reshaped tensor's, the entry becomes 0 and the target a constant.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from webbuild.fusion.rule import Rule
from webbuild.graph.ir import attr, const, prod, shared_const

# ops whose output keeps the leading (batch, sequence) axes of their first input(s)
_KEEPS_LEADING = {"MatMul", "MatMulNBits", "Add", "Mul", "Sub", "Cast", "SimplifiedLayerNormalization",
                  "SkipSimplifiedLayerNormalization", "GroupQueryAttention", "Sigmoid"}


@dataclass
class _Match:
    reshape: ir.Node
    target: list[int]


def match(r: ir.Node) -> _Match | None:
    target = _static_target(r) if const(r.inputs[1]) is None else None
    return _Match(r, target) if target is not None else None


def _rewrite(g: ir.Graph, m: _Match) -> None:
    target = shared_const(g, "reshape/" + "_".join(map(str, m.target)), np.array(m.target, np.int64))
    m.reshape.replace_input_with(1, target)
    m.reshape.attributes["allowzero"] = ir.AttrInt64("allowzero", 0)


def _static_target(r: ir.Node) -> list[int] | None:
    entries = _entries(r.inputs[1])
    if entries is None:
        return None
    out = []
    for j, e in enumerate(entries):
        if isinstance(e, int):
            if e == 0 and attr(r, "allowzero", 0):
                return None  # a literal zero-size axis
            out.append(e)
        elif e[1] == j and _same_leading(r.inputs[0], e[0], j):
            out.append(0)
        else:
            return None
    return out if out.count(-1) <= 1 else None


def _keeps_leading(n: ir.Node) -> bool:
    return n.op_type in _KEEPS_LEADING or n.op_type == "Split" and attr(n, "axis", 0) == -1


def _entries(v: ir.Value | None) -> list | None:
    """The target as a list of ints and (tensor, axis) reads, or None when not that simple."""
    c = const(v)
    if c is not None:
        return [int(x) for x in c.reshape(-1)]
    n = prod(v)
    if n is None:
        return None
    if n.op_type == "Concat":
        parts = [_entries(x) for x in n.inputs]
        known = [p for p in parts if p is not None]
        return None if len(known) != len(parts) else [e for p in known for e in p]
    if n.op_type in ("Unsqueeze", "Squeeze", "Cast"):
        return _entries(n.inputs[0])
    if n.op_type == "Shape":
        x = n.inputs[0]
        if x is None:
            return None
        rank = len(x.shape) if x.shape is not None else None
        start, end = attr(n, "start", 0), attr(n, "end", rank)
        if end is None or start < 0 or end < 0:
            return None
        return [(x, i) for i in range(start, end)]
    if n.op_type == "Gather":
        shape, idx = prod(n.inputs[0], "Shape"), const(n.inputs[1])
        if (shape is not None and idx is not None and idx.size == 1 and int(idx.reshape(-1)[0]) >= 0
                and attr(shape, "start", 0) >= 0):
            # Gather(Shape(x), i): axis start + i of x, known even when x's rank is not
            return [(shape.inputs[0], attr(shape, "start", 0) + int(idx.reshape(-1)[0]))]
        dims = _entries(n.inputs[0])
        if dims is None or idx is None or idx.size != 1:
            return None
        i = int(idx.reshape(-1)[0])
        return [dims[i]] if -len(dims) <= i < len(dims) else None
    return None


def _same_leading(data: ir.Value | None, x: ir.Value, axis: int) -> bool:
    """Whether data.shape[axis] == x.shape[axis] for a leading axis (not the last of either)."""
    if data is x:
        return True
    a, b = data.shape if data is not None else None, x.shape
    if a is not None and b is not None and len(a) > axis and len(b) > axis:
        da, db = a[axis], b[axis]
        if isinstance(da, ir.SymbolicDim) and da.value is not None and da == db:
            return True
        if b is not None and axis >= len(b) - 1:
            return False
    seen: set[int] = set()
    todo = [data]
    while todo and len(seen) < 2000:
        v = todo.pop()
        if v is x:
            return True
        n = prod(v)
        if n is None or id(n) in seen or not _keeps_leading(n):
            continue
        seen.add(id(n))
        todo.extend(i for i in n.inputs[:2] if i is not None and const(i) is None)
    return False


RULE = Rule("static_reshape", ("Reshape",), match, _rewrite)

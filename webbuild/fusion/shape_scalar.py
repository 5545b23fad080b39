"""A scalar computed from a tensor's head size: SDPA's scale, 1/sqrt(q.shape[-1]) (or its square root on Q
and on K), exported from the shape at run time when the head size is not static in the graph's shape
information (a partial rotary's Concat). Evaluated here from the last dim a rule knows (`last_dim`), over
the few ops such a computation uses; None when it needs anything else."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from webbuild.graph.ir import attr, const, prod

_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Sqrt": np.sqrt, "Reciprocal": np.reciprocal, "Cast": lambda a: a.astype(np.float64), "Squeeze": np.squeeze,
    "Identity": lambda a: a}
_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Div": np.divide, "Mul": np.multiply, "Pow": np.power, "Add": np.add, "Sub": np.subtract}


def evaluate(v: ir.Value | None, last_dim: Callable[[ir.Value], int | None], depth: int = 0) -> float | None:
    """The scalar `v`, when its only non-constant leaves are the last dims of Shape nodes' inputs."""
    got = _eval(v, last_dim, depth)
    return float(got.reshape(-1)[0]) if got is not None and got.size == 1 else None


def _eval(v: ir.Value | None, last_dim: Callable[[ir.Value], int | None], depth: int) -> np.ndarray | None:
    c = const(v)
    if c is not None:
        return c.astype(np.float64)
    n = prod(v)
    if n is None or depth > 12:
        return None
    if n.op_type == "Shape":
        return _shape_tail(n, last_dim)
    if n.op_type in _UNARY:
        a = _eval(n.inputs[0], last_dim, depth + 1)
        return None if a is None else _UNARY[n.op_type](a)
    if n.op_type in _BINARY:
        a, b = (_eval(x, last_dim, depth + 1) for x in n.inputs[:2])
        return None if a is None or b is None else _BINARY[n.op_type](a, b)
    if n.op_type in ("Slice", "Gather"):
        return _index(n, last_dim, depth)
    return None


def _shape_tail(n: ir.Node, last_dim: Callable[[ir.Value], int | None]) -> np.ndarray | None:
    """Shape(x) as [nan, ..., last dim]: only the last entry known (nan marks the rest)."""
    x = n.inputs[0]
    rank = len(x.shape) if x is not None and x.shape is not None else None
    d = last_dim(x) if x is not None else None
    if rank is None or d is None or attr(n, "end", None) is not None:
        return None
    shape = np.full(rank, np.nan)
    shape[-1] = d
    return shape[attr(n, "start", 0):]


def _index(n: ir.Node, last_dim: Callable[[ir.Value], int | None], depth: int) -> np.ndarray | None:
    """Slice or Gather of a 1-D shape with constant positions; None when it reaches an unknown entry."""
    a = _eval(n.inputs[0], last_dim, depth + 1)
    if a is None or a.ndim != 1:
        return None
    if n.op_type == "Gather":
        i = const(n.inputs[1])
        out = a[i] if i is not None else None
    else:
        starts, ends = const(n.inputs[1]), const(n.inputs[2])
        steps = const(n.inputs[4]) if len(n.inputs) > 4 and n.inputs[4] is not None else np.array([1])
        if starts is None or ends is None or steps is None:
            return None
        out = a[int(starts[0]):int(min(ends[0], len(a) + 1)):int(steps[0])]
    return None if out is None or np.isnan(out).any() else np.asarray(out, np.float64)

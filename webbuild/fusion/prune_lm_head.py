"""lm_head on the last position only: logits [B, S, V] -> [B, 1, V].

Generation only needs the next-token distribution; slicing the hidden state before the vocab
projection saves a [S, H] x [H, V] product on prefill. The slice goes right before the lm_head
(MatMul / MatMulNBits / Gemm) so the norm before it still sees the whole sequence (harmless) and
the rule works whether or not the final norm is fused; a bias, a logit scale or a softcap between
the head and the logits acts per position and stays where it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import onnx_ir as ir

from webbuild.fusion.rule import Miss, Rule
from webbuild.graph.ir import const, prod, shared_const

_HEADS = ("MatMul", "MatMulNBits", "Gemm")
_ELEMENTWISE = ("Add", "Sub", "Mul", "Div")


@dataclass
class _Match:
    head: ir.Node     # the lm_head (MatMul-like) node
    logits: ir.Value


def rule(output: str = "logits") -> Rule[_Match]:
    """The rule for the graph output `output`."""
    return Rule("prune_lm_head", (), partial(match, output=output), _rewrite)


def match(g: ir.Graph, output: str = "logits") -> _Match | Miss | None:
    logits = next((v for v in g.outputs if v.name == output), None)
    head = _head(logits) if logits is not None else None
    if logits is None or head is None:
        return Miss("logits are not produced by a MatMul-like lm_head", output)
    h = head.inputs[0]
    if h is None:
        return Miss("lm_head without an input", output)
    if _is_last_slice(h) or _one_position(logits):
        return None  # already pruned
    if h.shape is not None and len(h.shape) != 3:
        return Miss("lm_head input is not [B, S, H]", output)
    return _Match(head, logits)


def _head(logits: ir.Value) -> ir.Node | None:
    """The lm_head under elementwise steps with a constant (a bias, a logit scale, a softcap's Div, Tanh and
    Mul): they act on each position alone, so slicing before the head is slicing the logits."""
    v: ir.Value | None = logits
    for _ in range(6):
        n = prod(v)
        if n is None or n.op_type in _HEADS:
            return n
        with_const = len(n.inputs) == 2 and const(n.inputs[1]) is not None
        if n.op_type in ("Tanh", "Cast") or (n.op_type in _ELEMENTWISE and with_const):
            v = n.inputs[0]
        elif n.op_type in ("Add", "Mul") and len(n.inputs) == 2 and const(n.inputs[0]) is not None:
            v = n.inputs[1]
        else:
            return None
    return None


def _rewrite(g: ir.Graph, m: _Match) -> None:
    head, logits = m.head, m.logits
    h = head.inputs[0]
    assert h is not None, "match read it"
    starts = shared_const(g, "prune/minus_one", np.array([-1], np.int64))
    ends = shared_const(g, "prune/int_max", np.array([np.iinfo(np.int64).max], np.int64))
    axes = shared_const(g, "prune/axis_1", np.array([1], np.int64))
    sl = ir.node("Slice", [h, starts, ends, axes], name="lm_head/prune/Slice")
    sl.outputs[0].type = h.type
    if h.shape is not None:
        sl.outputs[0].shape = ir.Shape([h.shape[0], 1, h.shape[2]])
    g.insert_before(head, sl)
    head.replace_input_with(0, sl.outputs[0])
    v: ir.Value | None = logits
    while v is not None:  # the logits and the steps between them and the head: one position now
        if v.shape is not None and len(v.shape) == 3:
            v.shape = ir.Shape([v.shape[0], 1, v.shape[2]])
        n = prod(v)
        v = None if n is None or n is head else next((x for x in n.inputs if x is not None and const(x) is None), None)
    out = head.outputs[0]
    if out.shape is not None and len(out.shape) == 3:
        out.shape = ir.Shape([out.shape[0], 1, out.shape[2]])


def _one_position(v: ir.Value) -> bool:
    """Declared [B, 1, V] (e.g. the genai builder's Gather(-1) + Unsqueeze)."""
    return v.shape is not None and len(v.shape) == 3 and v.shape[1] == 1


def _is_last_slice(v: ir.Value) -> bool:
    sl = prod(v, "Slice")
    if sl is None or len(sl.inputs) < 4:
        return False
    starts, axes = const(sl.inputs[1]), const(sl.inputs[3])
    return starts is not None and axes is not None and starts.tolist() == [-1] and axes.tolist() == [1]

"""The bias of a linear layer, for rules that fold it into the fused op that follows
(SkipLayerNormalization's bias input, BiasGelu).

Two spellings: Add(MatMul output, b) and Gemm(x, W, b) (torchscript exports Linear on 2-D activations,
the audio encoder's, as Gemm). A folded Gemm becomes MatMul(x, W as [K, N]): the quantizer turns it
into a MatMulNBits without the separate bias Add it would otherwise split off.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from webbuild.graph.ir import attr, const, const_input, new_const, only_user


@dataclass
class Bias:
    node: ir.Node      # the Add or Gemm that adds the bias
    x: ir.Value        # the value before the bias (an Add's other operand; a Gemm's input)
    bias: ir.Value     # 1-D constant [N]


def find(v: ir.Value | None, user: ir.Node) -> Bias | None:
    """The bias added last in `v`, when `user` is the only consumer of `v`; the graph is not changed."""
    n = v.producer() if v is not None else None
    if v is None or n is None or only_user(v) is not user:
        return None
    if n.op_type == "Add":
        return _add_bias(n)
    if n.op_type == "Gemm":
        return _gemm_bias(n)
    return None


def take(g: ir.Graph, b: Bias) -> ir.Value:
    """The biasless value the fused op reads instead of the biased one (a Gemm is split for it)."""
    if b.node.op_type == "Add":
        return b.x
    w = const_input(b.node, 1)
    w = np.ascontiguousarray(w.T) if attr(b.node, "transB", 0) else w
    weight = b.node.inputs[1]
    assert weight is not None  # const_input read it
    mm = ir.node("MatMul", [b.x, new_const(g, f"{weight.name}_kn", w)], name=f"{b.node.name}/MatMul")
    out = b.node.outputs[0]
    mm.outputs[0].shape, mm.outputs[0].type = out.shape, out.type
    g.insert_after(b.node, mm)
    return mm.outputs[0]  # the Gemm's only user is replaced by the caller; cleanup drops the Gemm


def _add_bias(add: ir.Node) -> Bias | None:
    for x, c in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        b = const(c)
        if x is not None and c is not None and b is not None and const(x) is None and b.ndim == 1 and b.size > 1:
            return Bias(add, x, c)
    return None


def _gemm_bias(gemm: ir.Node) -> Bias | None:
    if len(gemm.inputs) < 3 or gemm.inputs[2] is None or attr(gemm, "transA", 0):
        return None
    if attr(gemm, "alpha", 1.0) != 1.0 or attr(gemm, "beta", 1.0) != 1.0:
        return None
    w, b = const(gemm.inputs[1]), const(gemm.inputs[2])
    x = gemm.inputs[0]
    if x is None or w is None or b is None or b.ndim != 1 or b.size != w.shape[0 if attr(gemm, "transB", 0) else 1]:
        return None
    return Bias(gemm, x, gemm.inputs[2])

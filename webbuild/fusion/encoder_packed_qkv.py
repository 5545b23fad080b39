"""Q, K, V projections of one MultiHeadAttention -> one packed projection + Split.

One matrix multiply reads the normed hidden state once instead of three times; after int4
quantization that is one MatMulNBits and one bias Add instead of three of each. onnxruntime-web's
WebGPU MultiHeadAttention does not take packed QKV ([B, S, heads, 3, hd]), so a Split on the last
axis feeds it. Runs after encoder_attention: each input is a projection of the same tensor (Gemm,
MatMul, or MatMul + bias Add, constant weights), behind an Unsqueeze in the batchless layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from webbuild.fusion.rule import Miss, Rule
from webbuild.graph.ir import MS, attr, const, new_const, only_user, prod, replace


@dataclass
class _Proj:
    x: ir.Value
    w: np.ndarray            # [K, N]
    b: np.ndarray | None     # [N]
    out: ir.Value            # the projection's output (what the Unsqueeze or the attention reads)
    unsqueeze: ir.Node | None


@dataclass
class _Match:
    mha: ir.Node
    projs: list[_Proj]  # Q, K, V


def match(mha: ir.Node) -> _Match | Miss:
    projs = [_projection(mha, slot) for slot in range(3)]
    why = _why_not(mha, projs)
    return Miss(why) if why else _Match(mha, [p for p in projs if p is not None])


def _projection(mha: ir.Node, slot: int) -> _Proj | None:
    v = mha.inputs[slot] if len(mha.inputs) > slot else None
    unsq = prod(v, "Unsqueeze") if v is not None else None
    out = unsq.inputs[0] if unsq is not None else v
    if out is None or only_user(out) is not (unsq if unsq is not None else mha):
        return None
    n = out.producer()
    if n is not None and n.op_type == "Gemm":
        return _gemm(n, unsq)
    b = None
    if n is not None and n.op_type == "Add":
        mm = next((prod(x, "MatMul") for x in n.inputs if const(x) is None and prod(x, "MatMul")), None)
        b = next((const(x) for x in n.inputs if const(x) is not None), None)
        if mm is None or b is None or b.ndim != 1 or only_user(mm.outputs[0]) is not n:
            return None
        n = mm
    w = const(n.inputs[1]) if n is not None and n.op_type == "MatMul" else None
    x = n.inputs[0] if n is not None else None
    return _Proj(x, w, b, out, unsq) if x is not None and w is not None and w.ndim == 2 else None


def _gemm(n: ir.Node, unsq: ir.Node | None) -> _Proj | None:
    if attr(n, "transA", 0) or attr(n, "alpha", 1.0) != 1.0 or attr(n, "beta", 1.0) != 1.0:
        return None
    w = const(n.inputs[1])
    b = const(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] is not None else None
    if w is None or n.inputs[0] is None or (
            len(n.inputs) > 2 and n.inputs[2] is not None and (b is None or b.ndim != 1)):
        return None
    return _Proj(n.inputs[0], w.T if attr(n, "transB", 0) else w, b, n.outputs[0], unsq)


def _why_not(mha: ir.Node, found: list[_Proj | None]) -> str | None:
    if len(mha.inputs) > 3 and mha.inputs[3] is not None:
        return "attention already takes a QKV bias"
    projs = [p for p in found if p is not None]
    if len(projs) != len(found):
        return "Q, K, V are not all single-use projections with constant weights"
    if not (projs[0].x is projs[1].x is projs[2].x):
        return "Q, K, V project different tensors (not self-attention)"
    if len({p.unsqueeze is None for p in projs}) != 1 or len({p.w.shape[0] for p in projs}) != 1:
        return "Q, K, V projections differ in shape or layout"
    return None


def _rewrite(g: ir.Graph, m: _Match) -> None:
    mha, projs = m.mha, m.projs
    name = mha.name or "attention"
    x, widths = projs[0].x, [p.w.shape[1] for p in projs]
    w = new_const(g, f"{name}/qkv_weight", np.concatenate([p.w for p in projs], axis=1))
    biases = [p.b if p.b is not None else np.zeros(p.w.shape[1], p.w.dtype) for p in projs]
    b = new_const(g, f"{name}/qkv_bias", np.concatenate(biases)) if any(p.b is not None for p in projs) else None
    nodes = _packed(x, w, b, name)
    if projs[0].unsqueeze is not None:
        nodes.append(ir.node("Unsqueeze", [nodes[-1].outputs[0], projs[0].unsqueeze.inputs[1]], name=f"{name}/QKV3D"))
    sizes = new_const(g, f"{name}/qkv_sizes", np.array(widths, np.int64))
    split = ir.node("Split", [nodes[-1].outputs[0], sizes], {"axis": -1}, num_outputs=3, name=f"{name}/SplitQKV")
    nodes.append(split)
    anchor = x.producer()
    for node in nodes:
        g.insert_after(anchor, node) if anchor is not None else g.insert_before(g.node(0), node)
        anchor = node
    for slot, out in enumerate(split.outputs):
        old = mha.inputs[slot]
        assert old is not None, "match found a projection in each slot"
        out.shape, out.type = old.shape, old.type
        replace(old, out)


def _packed(x: ir.Value, w: ir.Value, b: ir.Value | None, name: str) -> list[ir.Node]:
    """x @ W [+ b]: one Gemm for a 2-D x (what the quantizer splits into MatMulNBits + Add), else MatMul + Add."""
    if x.shape is not None and len(x.shape) == 2:
        return [ir.node("Gemm", [x, w] + ([b] if b is not None else []), name=f"{name}/QKV")]
    mm = ir.node("MatMul", [x, w], name=f"{name}/QKV")
    return [mm] + ([ir.node("Add", [mm.outputs[0], b], name=f"{name}/QKV_bias")] if b is not None else [])


RULE = Rule("encoder_packed_qkv", ("MultiHeadAttention",), match, _rewrite, domain=MS)

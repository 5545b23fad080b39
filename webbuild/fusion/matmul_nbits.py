"""Blockwise-dequantized constant weight + MatMul (or Gemm) -> com.microsoft.MatMulNBits, weights kept.

The weight W [K, N] is any spelling of webbuild.fusion.dequant (4- or 8-bit codes, signed or not,
with or without zero points), blocked along K, reached directly, through a float Cast, or as the
Transpose of a matrix [N, K] blocked along its last axis (the WebNN EP's weights, an lm_head tied to
the embedding table). Gemm(A, W, transB) without bias, alpha = beta = 1, counts as MatMul(A, W or W^T).
The codes are re-packed as they are (no re-quantization) into B uint8 [N, K/bs, bs*bits/8]; scales
[N, K/bs]; zero points packed likewise, omitted when all are MatMulNBits' default 2^(bits-1).
Runs before the cleanup pass, which would otherwise fold the dequantization into a float weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from webbuild.fusion import dequant
from webbuild.fusion.rule import Miss, Rule
from webbuild.graph.ir import MS, attr, import_ms_domain, new_const, replace


@dataclass
class _Match:
    matmul: ir.Node
    weight: dequant.Blocked


def match(mm: ir.Node) -> _Match | Miss | None:
    o = dequant.operand(mm.inputs[1])
    if not isinstance(o, dequant.Operand):
        return o
    b, where = o.blocked, o.where
    transposed = o.transposed != bool(mm.op_type == "Gemm" and attr(mm, "transB", 0))
    if mm.op_type == "Gemm" and ((len(mm.inputs) > 2 and mm.inputs[2] is not None) or attr(mm, "transA", 0)
                                 or attr(mm, "alpha", 1.0) != 1.0 or attr(mm, "beta", 1.0) != 1.0):
        # MatMulNBits' bias input has no WebGPU kernel; a transposed A or a factor has no place in it
        return Miss("a Gemm with a bias, transA or alpha/beta != 1", where)
    # W = the matrix, or its transpose: K must be the blocked axis
    if b.axis != (1 if transposed else 0):
        return Miss("the weight is blocked along N, not K (MatMulNBits blocks along K)", where)
    why = dequant.unfit(b, "MatMulNBits")
    return Miss(why, where) if why else _Match(mm, b)


def _rewrite(g: ir.Graph, m: _Match) -> None:
    import_ms_domain(g)
    mm, p = m.matmul, dequant.pack(g, m.weight)
    inputs = [mm.inputs[0], p.data, dequant.matmul_scales(g, p)]
    if p.zero is not None:
        inputs.append(new_const(g, f"{p.data.name}.zero_points", dequant.matmul_zero_points(p)))
    node = ir.node("MatMulNBits", inputs, {"K": p.k, "N": p.rows, "bits": p.bits, "block_size": p.block_size,
                                           "accuracy_level": dequant.accuracy_level(m.weight)},
                   domain=MS, name=(mm.name or mm.op_type) + "/MatMulNBits")
    node.outputs[0].type, node.outputs[0].shape = mm.outputs[0].type, mm.outputs[0].shape
    g.insert_after(mm, node)
    replace(mm.outputs[0], node.outputs[0])


RULE = Rule("matmul_nbits", ("MatMul", "Gemm"), match, _rewrite)

"""MatMul with a constant [K, N] weight -> com.microsoft.MatMulNBits, through onnxruntime's quantizer.

RTN is onnxruntime's DefaultWeightOnlyQuantizer (C++ block quantization, symmetric here: no zero
points, the layout the WebGPU DP4A / subgroup-matrix kernels want). HQQ is its HQQWeightOnlyQuantizer;
HQQ stores float zero points (W = (q - z) * s, z fractional after its optimisation), but the WebGPU
MatMulNBits kernel accepts uint8 zero points only ("Currently, only uint8 is supported for zero
points"), so we round them and pack them as uint8: that moves each weight by at most half a step
(tested). The quantizer also omits accuracy_level for HQQ, so we set it.
"""

from __future__ import annotations

import logging
from fnmatch import fnmatchcase

import numpy as np
import onnx
from onnx import numpy_helper
from onnxruntime.quantization.matmul_nbits_quantizer import (
    DefaultWeightOnlyQuantConfig,
    HQQWeightOnlyQuantConfig,
    MatMulNBitsQuantizer,
)

from webbuild.config import Quantize
from webbuild.graph.packing import n_blocks, pack_codes
from webbuild.quantize.lazy import load_deferred

MS_DOMAIN = "com.microsoft"


def excluded_nodes(model: onnx.ModelProto, patterns) -> list[str]:
    """Names of MatMul nodes matching any fnmatch pattern (e.g. '*lm_head*', '/layers.0/*')."""
    return [n.name for n in model.graph.node
            if n.op_type == "MatMul" and any(fnmatchcase(n.name, p) for p in patterns)]


def gemm_to_matmul(model: onnx.ModelProto) -> int:
    """Gemm(A, const B, C) -> MatMul(A, B as [K, N]) + Add(C): the quantizer only takes MatMul.

    torchscript exports Linear on 2-D activations (the audio encoder's) as Gemm with transB=1.
    Returns how many were rewritten; Gemms with transA, alpha/beta != 1 or a computed B stay.
    """
    inits = {t.name: t for t in model.graph.initializer}
    nodes, count = [], 0
    for node in model.graph.node:
        a = _attrs(node)
        if (node.op_type != "Gemm" or node.input[1] not in inits or a.get("transA", 0)
                or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0):
            nodes.append(node)
            continue
        w = numpy_helper.to_array(inits[node.input[1]])
        name = f"{node.input[1]}_kn{count}"
        w_kn = np.ascontiguousarray(w.T if a.get("transB") else w)
        model.graph.initializer.append(numpy_helper.from_array(w_kn, name))
        has_bias = len(node.input) > 2 and node.input[2]
        mm_out = node.output[0] + "_mm" if has_bias else node.output[0]
        nodes.append(onnx.helper.make_node("MatMul", [node.input[0], name], [mm_out], name=node.name + "/MatMul"))
        if has_bias:
            nodes.append(onnx.helper.make_node("Add", [mm_out, node.input[2]], [node.output[0]],
                                               name=node.name + "/Add"))
        count += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return count


def quantize_matmuls(model: onnx.ModelProto, s: Quantize) -> onnx.ModelProto:
    """Quantize every MatMul (and Gemm, rewritten) whose B is a constant initializer, except the excluded."""
    if s.method == "none":
        return model
    gemm_to_matmul(model)
    if s.method == "hqq":
        # HQQ reads weights with onnx's own reader, which refuses the lazy loader's absolute locations
        load_deferred(model)
        algo = HQQWeightOnlyQuantConfig(block_size=s.block_size, bits=s.bits)
    else:
        algo = DefaultWeightOnlyQuantConfig(block_size=s.block_size, is_symmetric=True,
                                            accuracy_level=s.accuracy_level, bits=s.bits)
    quantizer = MatMulNBitsQuantizer(model, nodes_to_exclude=excluded_nodes(model, s.exclude), algo_config=algo)
    # the quantizer logs every node at INFO through its own handler: thousands of lines for a real model
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    quantizer.process()
    out = quantizer.model.model
    if s.method == "hqq":
        _hqq_fixups(out, s)
    return out


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _hqq_fixups(model: onnx.ModelProto, s: Quantize) -> None:
    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type != "MatMulNBits" or node.domain != MS_DOMAIN:
            continue
        if "accuracy_level" not in _attrs(node):
            node.attribute.append(onnx.helper.make_attribute("accuracy_level", s.accuracy_level))
        if len(node.input) > 3 and node.input[3] in inits:
            _repack_zero_points(inits[node.input[3]], _attrs(node))


def _repack_zero_points(t: onnx.TensorProto, attrs: dict) -> None:
    zp = numpy_helper.to_array(t)
    if zp.dtype.kind != "f":
        return
    n, blocks, bits = attrs["N"], n_blocks(attrs["K"], attrs["block_size"]), attrs["bits"]
    codes = np.clip(np.rint(zp.astype(np.float32)), 0, 2 ** bits - 1).reshape(n, blocks)
    if bits == 4 and blocks % 2:
        codes = np.pad(codes, ((0, 0), (0, 1)))
    t.CopyFrom(numpy_helper.from_array(pack_codes(codes, bits), t.name))

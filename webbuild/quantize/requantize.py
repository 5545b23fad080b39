"""MatMulNBits from a source with another block size or bit width -> dequantize, re-quantize.

Published Qwen3-ASR exports carry int4 block 64 (some asymmetric); the WebGPU kernels want block 32
symmetric. The float weight is rebuilt from the packed bytes (packing.dequantize) and quantized again
with onnxruntime's C++ block quantizer, so the result is exactly what `quantize_matmuls` would give for
that float weight. Re-quantizing adds a second rounding; the tests bound it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper
from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, DefaultWeightOnlyQuantizer

from webbuild.config import Quantize
from webbuild.graph.packing import dequantize
from webbuild.quantize.quantize_matmuls import MS_DOMAIN, _attrs


def block_quantize(w: np.ndarray, bits: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Float [K, N] -> (packed uint8 [N, n_blocks, blob], scales [N, n_blocks]), symmetric, ORT's kernel."""
    cfg = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=True, bits=bits)
    packed, scales, _ = DefaultWeightOnlyQuantizer(cfg).qbits_block_quant(np.ascontiguousarray(w, np.float32))
    return packed, scales


def requantize(model: onnx.ModelProto, s: Quantize) -> list[str]:
    """Re-quantize MatMulNBits nodes whose bits or block_size differ from `s`; returns their names."""
    inits = {t.name: t for t in model.graph.initializer}
    done = []
    for node in model.graph.node:
        if node.op_type == "MatMulNBits" and node.domain == MS_DOMAIN and _needs(node, s):
            model.graph.initializer.extend(_requantize_node(node, inits, s))
            done.append(node.name)
    if done:  # rebuilding the list copies every initializer: only when some were replaced
        names = {i for n in model.graph.node for i in n.input}
        keep = [t for t in model.graph.initializer if t.name in names]
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)
    return done


def _needs(node: onnx.NodeProto, s: Quantize) -> bool:
    a = _attrs(node)
    return a["block_size"] != s.block_size or a["bits"] != s.bits


def _requantize_node(node: onnx.NodeProto, inits: dict, s: Quantize) -> list[onnx.TensorProto]:
    a = _attrs(node)
    get = lambda i: numpy_helper.to_array(inits[node.input[i]]) if len(node.input) > i and node.input[i] else None  # noqa: E731
    packed, scales = get(1), get(2)
    if packed is None or scales is None:
        raise ValueError(f"MatMulNBits {node.name!r} without its weight or scales")
    w = dequantize(packed, scales, get(3), a["K"], a["N"], a["bits"], a["block_size"])
    packed, new_scales = block_quantize(w, s.bits, s.block_size)
    base = node.input[1]
    b_name, s_name = f"{base}_b{s.block_size}q{s.bits}", f"{base}_b{s.block_size}q{s.bits}_scales"
    tensors = [numpy_helper.from_array(packed, b_name),
               numpy_helper.from_array(new_scales.astype(scales.dtype), s_name)]
    del node.input[1:]
    node.input.extend([b_name, s_name])  # symmetric: no zero points
    _set_attr(node, "bits", s.bits)
    _set_attr(node, "block_size", s.block_size)
    _set_attr(node, "accuracy_level", s.accuracy_level)
    return tensors


def _set_attr(node: onnx.NodeProto, name: str, value: int) -> None:
    for attr in node.attribute:
        if attr.name == name:
            attr.i = value
            return
    node.attribute.append(onnx.helper.make_attribute(name, value))

"""Small ONNX graphs for the quantization tests (built with onnx.helper, run with onnxruntime CPU)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def model(nodes, inputs, outputs, inits, opset: int = 17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def matmul_model(w: np.ndarray, names=("proj/MatMul",)) -> onnx.ModelProto:
    """x [B, S, K] -> chain of MatMuls by the same-shaped weights w [K, K] (or one [K, N])."""
    k = w.shape[0]
    nodes, inits, cur = [], {}, "x"
    for i, name in enumerate(names):
        out = "y" if i == len(names) - 1 else f"h{i}"
        inits[f"w{i}"] = w
        nodes.append(helper.make_node("MatMul", [cur, f"w{i}"], [out], name=name))
        cur = out
    return model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", k])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


def run(m: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, feeds)


def initializer(m: onnx.ModelProto, name: str) -> np.ndarray:
    return numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == name))


def attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def nodes_of(m: onnx.ModelProto, op: str) -> list[onnx.NodeProto]:
    return [n for n in m.graph.node if n.op_type == op]


def nbits_weight(m: onnx.ModelProto, node: onnx.NodeProto) -> np.ndarray:
    """The float [K, N] weight a MatMulNBits node multiplies by, from its packed bytes."""
    from webbuild.graph.packing import dequantize

    a = attrs(node)
    zp = initializer(m, node.input[3]) if len(node.input) > 3 and node.input[3] else None
    return dequantize(initializer(m, node.input[1]), initializer(m, node.input[2]), zp,
                      a["K"], a["N"], a["bits"], a["block_size"])

"""Small hand-built graphs for the rules' edge cases (spellings the zoo does not emit, negatives)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper

H = 16


def rms_graph(spelling: str, axis: int = -1, weight: bool = True, eps: float = 1e-6) -> ir.Model:
    """y = RMSNorm(x) over `axis`, in one of: 'div1' (x * 1/sqrt), 'recip' (x * Reciprocal(sqrt)),
    'divx' (x / sqrt), 'mulsq' (x*x instead of Pow)."""
    rng = np.random.default_rng(0)
    inits = [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
             helper.make_tensor("eps", TensorProto.FLOAT, [], [eps]),
             helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
             helper.make_tensor("axes", TensorProto.INT64, [1], [axis]),
             onnx.numpy_helper.from_array(rng.standard_normal(H).astype(np.float32), "w")]
    if spelling == "mulsq":
        sq = helper.make_node("Mul", ["x", "x"], ["sq"])
    else:
        sq = helper.make_node("Pow", ["x", "two"], ["sq"])
    nodes = [sq, helper.make_node("ReduceMean", ["sq", "axes"], ["m"], keepdims=1),
             helper.make_node("Add", ["m", "eps"], ["me"]), helper.make_node("Sqrt", ["me"], ["s"])]
    if spelling == "divx":
        nodes.append(helper.make_node("Div", ["x", "s"], ["n"]))
    elif spelling == "recip":
        nodes += [helper.make_node("Reciprocal", ["s"], ["r"]), helper.make_node("Mul", ["x", "r"], ["n"])]
    else:
        nodes += [helper.make_node("Div", ["one", "s"], ["r"]), helper.make_node("Mul", ["r", "x"], ["n"])]
    nodes.append(helper.make_node("Mul", ["w", "n"], ["y"]) if weight else helper.make_node("Identity", ["n"], ["y"]))
    g = helper.make_graph(nodes, "rms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 3, H])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 3, H])], inits)
    return ir.from_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))


def residual_graph(bias: bool) -> ir.Model:
    """h = a + (b or a constant bias); y = RMSNorm(h) * w; out = h + y (the residual continues)."""
    m = rms_graph("recip")
    g = m.graph
    x = g.inputs[0]
    a = ir.Value(name="a", shape=ir.Shape(["b", 3, H]), type=ir.TensorType(ir.DataType.FLOAT))
    g.inputs.append(a)
    other = ir.Value(name="bias", const_value=ir.tensor(np.ones(H, np.float32), name="bias")) if bias else a
    if bias:
        g.register_initializer(other)
    b = ir.Value(name="b_in", shape=ir.Shape(["b", 3, H]), type=ir.TensorType(ir.DataType.FLOAT))
    g.inputs.append(b)
    add = ir.node("Add", [b, other], name="residual_add")
    g.insert_before(g.node(0), add)
    ir.convenience.replace_all_uses_with(x, add.outputs[0])
    g.inputs.remove(x)
    y = g.outputs[0]
    out = ir.node("Add", [add.outputs[0], y], name="next_residual")
    g.append(out)
    out.outputs[0].name = "out"
    out.outputs[0].shape, out.outputs[0].type = y.shape, y.type
    g.outputs[0] = out.outputs[0]
    return m


def run(model: ir.Model, feeds: dict, optimize: bool = True) -> list[np.ndarray]:
    """`optimize=False` keeps onnxruntime from rewriting the graph first (it turns DequantizeLinear +
    MatMul into MatMulNBits with int8 activations, which is not the graph under test)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(ir.to_proto(model).SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)

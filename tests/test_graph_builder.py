"""webbuild.graph.builder on small graphs: what a Builder makes computes what it says on onnxruntime CPU, its nodes
and outputs are named by its rules, equal constants are one initializer, and a model made from nothing is written
as onnx.helper would write it."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from webbuild.graph.builder import Builder, new_model, value
from webbuild.graph.files import write_model

F = ir.DataType.FLOAT


def scaled_sum(typed_consts: bool = True) -> ir.Model:
    """y = Reshape(x * 2, [-1]) + 1 over x [2, 3], the output named `y`."""
    model = new_model("scaled", 17, ir_version=9)
    b = Builder(model.graph, "s/", typed_consts)
    x = b.input("x", F, [2, 3], {"note": "kept"})
    doubled = b.op("Mul", [x, b.const("two", np.float32(2))], F, [2, 3])
    flat = b.reshape(doubled, [-1], "s/flat", F, [6]).outputs[0]
    y = b.op("Add", [flat, b.const("one", np.float32(1))], F, [6], output="y")
    b.place()
    model.graph.outputs.append(y)
    return model


def test_a_built_graph_computes_what_it_says(tmp_path):
    """The nodes in the order made, the Reshape's shape a constant, the model written by write_model and run."""
    model = scaled_sum()
    assert model.graph.inputs[0].meta["note"] == "kept"
    write_model(model, tmp_path / "scaled.onnx")
    onnx.checker.check_model(str(tmp_path / "scaled.onnx"), full_check=True)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = ort.InferenceSession(str(tmp_path / "scaled.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(y, x.reshape(-1) * 2 + 1)


def test_names_follow_the_builders_rules():
    """Unnamed nodes are <prefix><output or op>_<n>, an empty name stays empty, `named` gives node and output one
    name, and equal constants of one name are one initializer (another value under the same name is a new one)."""
    graph = ir.Graph([], [], nodes=[], opset_imports={"": 17})
    b = Builder(graph, "p/")
    x = b.input("x", F, [4])
    a = b.op("Neg", [x], F, [4])
    c = b.op("Abs", [a], F, [4], output="c")
    d = b.node("Relu", [c], "", outputs=2)
    e = b.named("Sqrt", [c], "p/root", F, [4])
    assert [n.name for n in b.nodes] == ["p/Neg_0", "p/c_1", "", "p/root"]
    assert (a.name, c.name, e.outputs[0].name, len(d.outputs)) == (None, "c", "p/root", 2)
    assert b.const("k", np.zeros(3, np.float32)) is b.const("k", np.zeros(3, np.float32))
    assert b.const("k", np.ones(3, np.float32)).name != "p/k"
    assert list(graph) == []  # placed only when asked
    b.place()
    assert [n.op_type for n in graph] == ["Neg", "Abs", "Relu", "Sqrt"]


def test_a_model_from_nothing_has_the_bytes_onnx_helper_gives_it():
    """With typed_consts False (no value_info for the constants) a model made from nothing serializes byte for byte
    as the same graph made with onnx.helper, the unnamed output named by the graph (`val_0`): how the delta graph and
    the mel front-end kept their bytes."""
    node = lambda op, ins, out, name: helper.make_node(op, ins, [out], name=name)  # noqa: E731
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [node("Mul", ["x", "s/two"], "val_0", "s/Mul_0"), node("Reshape", ["val_0", "s/shape_-1"], "s/flat", "s/flat"),
         node("Add", ["s/flat", "s/one"], "y", "s/y_2")], "scaled",
        [helper.make_tensor_value_info("x", f, [2, 3])], [helper.make_tensor_value_info("y", f, [6])],
        [numpy_helper.from_array(np.array(2, np.float32), "s/two"),
         numpy_helper.from_array(np.array([-1], np.int64), "s/shape_-1"),
         numpy_helper.from_array(np.array(1, np.float32), "s/one")])
    want = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    want.ir_version = 9
    built = scaled_sum(typed_consts=False)
    for v in built.graph:  # the helper graph declares no intermediate value
        for out in v.outputs:
            if not out.is_graph_output():
                out.type, out.shape = None, None
    assert ir.serde.serialize_model(built).SerializeToString() == want.SerializeToString()
    typed = ir.serde.serialize_model(scaled_sum())
    assert {v.name for v in typed.graph.value_info} >= {"s/two", "s/one"}  # the default declares its constants


def test_value_leaves_unknown_parts_unset():
    v = value("v")
    assert (v.name, v.type, v.shape) == ("v", None, None)
    assert value(None, F, ["n", 2]).shape == ir.Shape(["n", 2])


def test_builders_of_one_graph_share_constants_under_const_prefix():
    """Two builders naming their nodes apart share one constant under a common `const_prefix` (how the decomposition
    names each fused node's primitives after it, its constants once for the graph); a list is a constant too."""
    graph = ir.Graph([], [], nodes=[], opset_imports={"": 17})
    a, b = (Builder(graph, f"{p}/", const_prefix="shared/") for p in ("a", "b"))
    x = a.input("x", F, [3])
    a.op("Add", [x, a.const("axes", [-1])])
    b.op("Add", [x, b.const("axes", [-1])])
    assert [n.name for n in a.nodes + b.nodes] == ["a/Add_0", "b/Add_0"]
    assert list(graph.initializers) == ["shared/axes"]
    assert graph.initializers["shared/axes"].const_value.numpy().tolist() == [-1]

"""The shared-weights form (webbuild/forms/shared_weights.py) on a small graph whose weights live in a file: the
form's graph fed the table's weights from that file gives the graph's outputs exactly, and the check stage's
comparison finds a table or a graph that does not match."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from webbuild.forms.form import Made, Miss
from webbuild.forms.shared_weights import differences, shared_name, shared_weights_form, weights_table

DATA = "small.onnx.data"


def small_graph(folder):
    """y = (x @ w1 + b) @ w2, w1 and w2 in the weights file, b inline."""
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal((6, 3)).astype(np.float32)
    b = numpy_helper.from_array(np.arange(6, dtype=np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
         helper.make_node("MatMul", ["hb", "w2"], ["y"])], "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"), b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, folder / "small.onnx", save_as_external_data=True, location=DATA, size_threshold=64)
    return {"w1": w1, "w2": w2}


def fed(folder, table):
    """The table's weights read from the weights file, as the page's weights.js uploads them."""
    raw = (folder / DATA).read_bytes()
    return {name: np.frombuffer(raw[e["offset"]:e["offset"] + e["length"]], dtype=e["type"]).reshape(e["dims"])
            for name, e in table.items()}


def test_the_form_fed_its_weights_gives_the_graphs_outputs(tmp_path):
    weights = small_graph(tmp_path)
    made = shared_weights_form(tmp_path, "small.onnx", DATA)
    assert made == Made(shared_name("small.onnx")) == Made("small.shared.onnx")
    table = weights_table(tmp_path / "small.onnx", DATA)
    assert set(table) == {"w1", "w2"} and table["w1"]["dims"] == [4, 6] and table["w1"]["type"] == "float32"
    shared = onnx.load(tmp_path / made.file)
    assert [i.name for i in shared.graph.input] == ["x", "w1", "w2"]
    assert [i.name for i in shared.graph.initializer] == ["b"]  # inline: not the weights file's
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    want = ort.InferenceSession(str(tmp_path / "small.onnx")).run(None, {"x": x})[0]
    weights_from_file = fed(tmp_path, table)
    assert all(np.array_equal(weights_from_file[n], w) for n, w in weights.items())
    got = ort.InferenceSession(str(tmp_path / made.file)).run(None, {"x": x, **weights_from_file})[0]
    assert np.array_equal(got, want)
    assert differences(tmp_path / "small.onnx", tmp_path / made.file, table, DATA) == []


def test_the_comparison_finds_a_wrong_table_or_graph(tmp_path):
    small_graph(tmp_path)
    made = shared_weights_form(tmp_path, "small.onnx", DATA)
    table = weights_table(tmp_path / "small.onnx", DATA)
    moved = {**table, "w2": {**table["w2"], "offset": table["w2"]["offset"] + 4}}
    assert differences(tmp_path / "small.onnx", tmp_path / made.file, moved, DATA) == [
        f"the manifest's weights are not where the graph's initializers lie in {DATA}"]
    shared = onnx.load(tmp_path / made.file)
    shared.graph.node[1].op_type = "Sub"
    onnx.save(shared, tmp_path / "changed.onnx")
    assert differences(tmp_path / "small.onnx", tmp_path / "changed.onnx", table, DATA) == [
        "its nodes differ from the graph's"]


def test_a_graph_without_weights_in_the_file_is_reported_not_lost(tmp_path):
    small_graph(tmp_path)
    assert shared_weights_form(tmp_path, "small.onnx", "other.data") == Miss(
        "no initializer of small.onnx lives in other.data", loses=False)

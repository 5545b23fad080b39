"""runtime/ort-start.js's START_MODEL: the bytes the page makes its first onnxruntime session of, a valid model that
onnxruntime runs (the page's own start is checked in a browser by tests/test_site.py's load timeline)."""

import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

ORT_START = Path(__file__).parents[1] / "webbuild" / "template" / "runtime" / "ort-start.js"


def start_model() -> bytes:
    array = re.search(r"START_MODEL = new Uint8Array\(\[([\d,\s]+)\]\)", ORT_START.read_text())
    assert array, "START_MODEL not found in runtime/ort-start.js"
    return bytes(int(b) for b in array.group(1).split(","))


def test_the_start_model_is_one_identity_node_onnxruntime_runs():
    model = onnx.load_from_string(start_model())
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["Identity"]
    session = ort.InferenceSession(start_model(), providers=["CPUExecutionProvider"])
    x = np.array([1.5], np.float32)
    assert session.run(None, {"x": x})[0].tolist() == [1.5]

"""Graph validity after a rewrite: onnx checker, onnx shape inference, onnxruntime session creation."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import onnxruntime as ort

from webbuild.graph import cpu_session as cpu

# onnxruntime registers these in the default domain; onnx's checker has no schema for them
_ORT_DEFAULT_DOMAIN_OPS = {"SimplifiedLayerNormalization"}
_CHECK_ONLY = "webbuild.check_only"


def check(model: ir.Model) -> ort.InferenceSession:
    """Raise if the graph is invalid; return a CPU session on it. Loads external weights into memory
    (fine for test-sized models; for big ones check the saved file with `check_file`)."""
    ir.external_data.load_to_model(model)
    proto = ir.to_proto(model)
    _check_structure(proto)
    return _session(proto.SerializeToString())


def check_file(path) -> ort.InferenceSession:
    """The same on a saved model, without reading its weights into the checker; the session does not
    prepack its weights, so external data stays memory-mapped instead of copied (a check, not a run)."""
    proto = onnx.load(str(path), load_external_data=False)
    weightless = onnx.ModelProto()
    weightless.CopyFrom(proto)
    graph = weightless.graph
    # weights become typed graph inputs: the checker then needs neither their bytes nor their files
    graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in graph.initializer)
    graph.ClearField("initializer")
    _check_structure(weightless)
    return _session(str(path), prepack=False)


def _check_structure(proto: onnx.ModelProto) -> None:
    renamed = [n for n in proto.graph.node if n.domain == "" and n.op_type in _ORT_DEFAULT_DOMAIN_OPS]
    for n in renamed:
        n.domain = _CHECK_ONLY
    proto.opset_import.append(onnx.helper.make_opsetid(_CHECK_ONLY, 1))
    try:
        onnx.checker.check_model(proto, full_check=False)
        onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=False)
    finally:
        for n in renamed:
            n.domain = ""
        proto.opset_import.pop()


def _session(model, prepack: bool = True) -> ort.InferenceSession:
    return cpu.session(model, cpu.options({} if prepack else {"session.disable_prepacking": "1"}))

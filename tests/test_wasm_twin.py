"""webbuild.quantize.wasm_twin on the example's quantized decoder: no int4 operator left, every weight
folded to float32 by onnxruntime at session creation, and the logits of the int4 graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from webbuild.errors import BuildError
from webbuild.pipeline.fuse import run_fuse
from webbuild.quantize.wasm_twin import foldable, wasm_graph

EXAMPLE_MODEL = Path(__file__).resolve().parents[1] / "examples" / "tiny-asr" / "model"
INT4_OPS = {"MatMulNBits", "GatherBlockQuantized"}


@pytest.fixture(scope="module")
def quantized(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fused") / "q"
    run_fuse(EXAMPLE_MODEL, out)
    return out / "decoder.onnx"


def session(path: Path, optimized: Path | None = None) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if optimized:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def prefill_logits(s: ort.InferenceSession, ids: list[int]) -> np.ndarray:
    shapes = {i.name: i.shape for i in s.get_inputs()}
    feeds = {"input_ids": np.array([ids], np.int64), "audio_offset": np.zeros(1, np.int64),
             "audio_features": np.zeros((1, 0, shapes["audio_features"][2]), np.float32),
             "attention_mask": np.ones((1, len(ids)), np.int64)}
    for name, shape in shapes.items():
        if name.startswith("past_key_values."):
            feeds[name] = np.zeros((1, shape[1], 0, shape[3]), np.float32)
    return s.run(["logits"], feeds)[0][0, -1]


def test_twin_spells_int4_in_standard_ops_that_fold_to_float(quantized, tmp_path):
    twin = quantized.with_name("decoder.wasm.onnx")
    assert wasm_graph(quantized, twin)
    source = onnx.load(str(quantized), load_external_data=False).graph
    graph = onnx.load(str(twin), load_external_data=False).graph
    assert not INT4_OPS & {n.op_type for n in graph.node}
    assert {i.name for i in graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL} <= \
        {i.name for i in source.initializer}  # the same weights file, no new weights
    matmuls = sum(n.op_type == "MatMulNBits" for n in source.node)
    # at session creation every weight's dequantization folds away: one MatMul per MatMulNBits remains
    session(twin, tmp_path / "optimized.onnx")
    folded = onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False).graph
    assert sum(n.op_type == "MatMul" for n in folded.node) == matmuls
    assert not [n.name for n in folded.node if n.op_type == "Transpose" and n.name.startswith("wasm_twin/")]

    ids = [1, 8, 15, 42, 3, 99, 7]
    want, got = prefill_logits(session(quantized), ids), prefill_logits(session(twin), ids)
    assert int(np.argmax(got)) == int(np.argmax(want))
    # onnxruntime CPU's MatMulNBits (accuracy level 4) rounds activations to int8; the twin is exact
    err = np.max(np.abs(got - want)) / np.ptp(want)
    print(f"twin vs int4 graph: {err:.2e} of the logit range")
    assert err < 0.02


def test_twin_refuses_asymmetric_weights(quantized, tmp_path):
    model = onnx.load(str(quantized), load_external_data=False)
    node = next(n for n in model.graph.node if n.op_type == "MatMulNBits")
    node.input.append("zero_points")
    bad = quantized.with_name("asymmetric.onnx")
    onnx.save(model, str(bad))
    with pytest.raises(BuildError, match="zero points"):
        wasm_graph(bad, tmp_path / "twin.onnx")


def test_twin_without_folding_keeps_matmul_nbits_and_rewrites_only_the_lookup(quantized):
    twin = quantized.with_name("decoder.nbits.wasm.onnx")  # beside its weights file
    assert wasm_graph(quantized, twin, fold_matmuls=False)
    source = onnx.load(str(quantized), load_external_data=False)
    graph = onnx.load(str(twin), load_external_data=False).graph
    ops = [n.op_type for n in graph.node]
    assert "GatherBlockQuantized" not in ops  # the wasm build has no kernel for it
    assert ops.count("MatMulNBits") == sum(n.op_type == "MatMulNBits" for n in source.graph.node) > 0
    assert foldable(source)
    ids = [1, 8, 15, 42, 3, 99, 7]
    got, want = prefill_logits(session(twin), ids), prefill_logits(session(quantized), ids)
    assert np.array_equal(got, want)  # the same kernels on the same weights


def test_asymmetric_weights_are_not_foldable(quantized):
    model = onnx.load(str(quantized), load_external_data=False)
    next(n for n in model.graph.node if n.op_type == "MatMulNBits").input.append("zero_points")
    assert not foldable(model)

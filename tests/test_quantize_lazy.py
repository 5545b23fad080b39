"""Lazily loaded decoders quantize exactly as fully loaded ones, without reading their weights up front."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
from onnx import numpy_helper

from webbuild.config import Quantize
from webbuild.quantize.lazy import load_deferred, load_lazily
from webbuild.quantize.variants import embed_table, quantize_decoder


def _deferred(model: onnx.ModelProto) -> list[str]:
    return [t.name for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
            and os.path.isabs(next(e.value for e in t.external_data if e.key == "location"))]


def _matmul_weights(model: onnx.ModelProto) -> set[str]:
    return {n.input[1] for n in model.graph.node if n.op_type == "MatMul"}


def test_matmul_weights_stay_on_disk_until_read(zoo_export):
    src = zoo_export("merged") / "decoder_model_merged.onnx"
    lazy = load_lazily(src)
    deferred = _deferred(lazy)
    assert deferred and set(deferred) <= _matmul_weights(lazy)
    assert not any(t.HasField("raw_data") for t in lazy.graph.initializer if t.name in deferred)
    full = {t.name: numpy_helper.to_array(t, str(src.parent)) for t in onnx.load(str(src)).graph.initializer}
    assert load_deferred(lazy) == len(deferred) and not _deferred(lazy)
    for t in lazy.graph.initializer:  # everything now in memory, equal to onnx.load's
        np.testing.assert_array_equal(numpy_helper.to_array(t), full[t.name])


def test_lazy_and_full_load_quantize_to_the_same_graph(zoo_export):
    src = zoo_export("merged")
    table, cfg = embed_table(src)
    s = Quantize()
    lazy, lazy_rep = quantize_decoder(load_lazily(src / "decoder_model_merged.onnx"), table, cfg, s)
    full, full_rep = quantize_decoder(onnx.load(str(src / "decoder_model_merged.onnx")), table, cfg, s)
    assert not _deferred(lazy)
    assert json.dumps(lazy_rep, sort_keys=True) == json.dumps(full_rep, sort_keys=True)
    assert lazy.SerializeToString(deterministic=True) == full.SerializeToString(deterministic=True)


def test_excluded_weights_are_read_back(zoo_export):
    src = zoo_export("merged")
    table, cfg = embed_table(src)
    s = Quantize(exclude=("*",))  # nothing quantized: every deferred weight must come back
    model, _ = quantize_decoder(load_lazily(src / "decoder_model_merged.onnx"), table, cfg, s)
    assert not _deferred(model)
    assert "MatMul" in {n.op_type for n in model.graph.node}

"""The encoder driver on real exports: the trained example (torchscript) and zoo exports of both
exporters, against the unfused graph on onnxruntime CPU."""

import json
import logging
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

from tests.fusion.encoder_graphs import attention_graph
from webbuild.fusion import encoder_attention
from webbuild.fusion.fuse_encoder import fuse_encoder
from webbuild.fusion.validate import check
from webbuild.graph.ir import census
from webbuild.pipeline.fuse import run_fuse, summary

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-asr" / "model" / "encoder.onnx"
LAYERS = 4
# mel frames: one chunk (13 tokens), and 30 s (390 tokens in 4 attention windows of 104)
FRAMES = (100, 3000)


def _encoder(request, zoo) -> Path:
    return EXAMPLE if request.param == "example" else zoo.export("qwen3-asr-split", request.param) / "encoder.onnx"


@pytest.fixture(scope="module", params=["example", "torchscript", "dynamo"])
def fused(request, zoo, tmp_path_factory):
    src = _encoder(request, zoo)
    model, report = fuse_encoder(src)
    out = tmp_path_factory.mktemp("enc") / "encoder.onnx"
    ir.save(model, out)
    return request.param, src, out, report


def test_layers_fuse_completely(fused):
    name, _, _, report = fused
    ops = report["ops_after"]
    assert not report["not_fused"]
    assert report["fused"]["encoder_attention"] == ops["MultiHeadAttention"] == LAYERS
    assert report["fused"]["encoder_packed_qkv"] == ops["Split"] == LAYERS  # one Q/K/V projection each
    # every norm but the first takes the residual: 2 per layer (the second layer norm and ln_post)
    assert report["fused"]["skip_layer_norm"] == ops["SkipLayerNormalization"] == 2 * LAYERS
    assert ops["LayerNormalization"] == 1
    # 4 MLP + projector GELUs (+ 3 after the convolutions); BiasGelu where the Linear has a bias
    assert report["fused"]["gelu"] == 2 * LAYERS
    assert ops.get("Gelu", 0) + ops.get("BiasGelu", 0) == 2 * LAYERS
    assert not {"Erf", "Softmax", "ReduceMean", "Pow", "Sqrt"} & set(ops)
    assert report["nodes_after"] < report["nodes_before"]
    print(f"{name}: {report['nodes_before']} -> {report['nodes_after']} nodes")


def test_a_layer_is_eleven_nodes(fused):
    """Skip norm, packed QKV projection, Unsqueeze, Split, attention, Squeeze, output projection, Skip
    norm, MLP in, (Bias)Gelu, MLP out."""
    ops = [n.op_type for n in ir.load(fused[2]).graph]
    at = [i for i, op in enumerate(ops) if op == "MultiHeadAttention"]
    assert {b - a for a, b in zip(at, at[1:])} == {11}


def test_outputs_equal_the_unfused_graph(fused):
    _, src, out, _ = fused
    rng = np.random.default_rng(0)
    for frames in FRAMES:
        mel = rng.standard_normal((1, 128, frames)).astype(np.float32)
        want, got = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"mel": mel})[0]
                     for p in (src, out))
        assert got.shape == want.shape
        err = np.abs(got - want).max() / (want.max() - want.min())
        print(f"{frames} frames: max error {err:.1e} of the output range")
        assert err < 1e-4


def test_fused_encoder_is_left_alone(fused):
    _, _, out, _ = fused
    model = ir.load(out)
    before = census(model)
    again, report = fuse_encoder(model)
    assert census(again) == before and not report["fused"] and not report["not_fused"]


def test_unrecognised_attention_stays_valid_and_is_reported():
    model, report = fuse_encoder(attention_graph("batch", scale_on="v"))
    assert report["not_fused"][0]["rule"] == encoder_attention.RULE.name
    assert "Softmax" in report["ops_after"]
    check(model)


def test_webbuild_fuse_reports_the_encoder_as_a_second_graph(zoo, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="webbuild"):
        rep = run_fuse(zoo.source("merged", "torchscript"), tmp_path / "out", tmp_path / "r.json", quantize=False)
    enc = json.loads((tmp_path / "r.json").read_text())["encoder"]
    assert enc == rep["encoder"] and enc["ops_after"]["MultiHeadAttention"] == LAYERS
    assert len(list(ir.load(tmp_path / "out" / "encoder.onnx").graph)) == enc["nodes_after"]
    lines = summary(rep)
    table = lines[lines.index("encoder:"):]
    assert next(line for line in table if line.startswith("MultiHeadAttention")).split()[1:] == ["0", "->", "4"]
    assert caplog.messages[-1] == f"fused encoder.onnx: {enc['nodes_before']} -> {enc['nodes_after']} nodes"

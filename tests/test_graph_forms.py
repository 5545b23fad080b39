"""The graph forms' driver (webbuild.forms.form) on small hand-built graphs: a form made and run on onnxruntime,
forms not made with their reasons in the build report, and fusion.strict (`webbuild build --strict`) stopping the
forms stage on a form lost, not on one that does not apply by design."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from webbuild.config import load_config
from webbuild.errors import FusionIncomplete
from webbuild.forms.form import Report
from webbuild.forms.step import STEP
from webbuild.forms.webgpu import WEBGPU
from webbuild.graph.packing import dequantize
from webbuild.layouts import layout
from webbuild.pipeline.build_report import BuildReport
from webbuild.pipeline.stages import record_forms
from webbuild.pipeline.state import BuildContext, BuildState, SourceModel
from webbuild.site.contract import IO

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny-asr" / "model.yaml"
K, N, BLOCK = 32, 8, 32


def matmul_nbits(path: Path, level: int) -> tuple[np.ndarray, np.ndarray]:
    """y = x @ W, W [K, N] an int4 MatMulNBits at accuracy level `level`; returns (packed codes, scales)."""
    rng = np.random.default_rng(0)
    packed = rng.integers(0, 256, (N, K // BLOCK, BLOCK // 2), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.1, N * K // BLOCK).astype(np.float32)
    node = helper.make_node("MatMulNBits", ["x", "w", "s"], ["y"], domain="com.microsoft", K=K, N=N, bits=4,
                            block_size=BLOCK, accuracy_level=level)
    graph = helper.make_graph([node], "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, N])],
                              [numpy_helper.from_array(packed, "w"), numpy_helper.from_array(scales, "s")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.microsoft", 1)]), path)
    return packed, scales


def decoder_without_mask(path: Path, gqa: bool) -> None:
    """A decoder's interface without attention_mask: token ids in, logits out, through a GroupQueryAttention
    (never run: the step form's check reads the interface) or an Identity."""
    op = helper.make_node("GroupQueryAttention", [IO.input_ids], [IO.logits], domain="com.microsoft") if gqa \
        else helper.make_node("Identity", [IO.input_ids], [IO.logits])
    graph = helper.make_graph([op], "decoder", [helper.make_tensor_value_info(IO.input_ids, TensorProto.INT64, [1, 1])],
                              [helper.make_tensor_value_info(IO.logits, TensorProto.FLOAT, [1, 1, 8])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.microsoft", 1)]), path)


def test_a_form_made_is_recorded_and_computes_what_its_source_does(tmp_path):
    """The WebGPU form at accuracy level 0 of a MatMulNBits at level 4: made, recorded, and y = x @ W on onnxruntime."""
    packed, scales = matmul_nbits(tmp_path / "decoder.onnx", level=4)
    report = Report()
    made = report.make(WEBGPU, "fp32/decoder", tmp_path / "decoder.onnx", tmp_path / "webgpu.onnx", 0)
    assert made == "webgpu.onnx" and report.missed == []
    assert report.made == [{"form": "webgpu", "graph": "fp32/decoder", "file": "webgpu.onnx"}]
    node = onnx.load(str(tmp_path / "webgpu.onnx")).graph.node[0]
    assert helper.get_attribute_value(next(a for a in node.attribute if a.name == "accuracy_level")) == 0
    x = np.random.default_rng(1).standard_normal((1, K)).astype(np.float32)
    (y,) = ort.InferenceSession(str(tmp_path / "webgpu.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(y, x @ dequantize(packed, scales, None, K, N, 4, BLOCK), rtol=1e-4, atol=1e-4)
    # already in the form: nothing to make and nothing to report
    assert report.make(WEBGPU, "again", tmp_path / "webgpu.onnx", tmp_path / "twice.onnx", 0) is None
    assert not (tmp_path / "twice.onnx").exists() and len(report.made) == 1 and report.missed == []


@pytest.mark.parametrize("gqa", [True, False])
def test_a_form_not_made_is_reported_with_its_reason(tmp_path, gqa):
    """The step form of a decoder without attention_mask: nothing written, the reason recorded; lost where the
    decoder has GroupQueryAttention, by design (not lost) where it has none."""
    decoder_without_mask(tmp_path / "decoder.onnx", gqa)
    report = Report()
    assert report.make(STEP, "fp32/decoder", tmp_path, "decoder.onnx") is None
    assert not (tmp_path / "decoder.step.onnx").exists() and report.made == []
    why = f"no {IO.attention_mask} input or no {IO.logits} output" if gqa else "no GroupQueryAttention"
    assert report.as_dict()["not_made"] == [{"form": "step", "graph": "fp32/decoder", "why": why, "loses": gqa}]


@pytest.mark.parametrize("strict", [True, False])
def test_strict_stops_the_build_on_a_form_lost(tmp_path, strict):
    """The forms stage's record: every miss in build-report.json's `forms` and its closing table; with
    fusion.strict a lost form is FusionIncomplete (exit code 1) naming it, a form that does not apply is not."""
    cfg = load_config(EXAMPLE)
    cfg = cfg.model_copy(update={"fusion": cfg.fusion.model_copy(update={"strict": strict})})
    build = BuildReport(name="tiny")
    ctx = BuildContext(cfg, tmp_path / "site", tmp_path / "work", build, BuildState(SourceModel(
        cfg.source.dir, layout(cfg.source.layout))))
    for gqa, name in ((False, "plain"), (True, "gqa")):
        (tmp_path / name).mkdir()
        decoder_without_mask(tmp_path / name / "decoder.onnx", gqa)
    by_design = Report()
    by_design.make(STEP, "fp32/decoder", tmp_path / "plain", "decoder.onnx")
    record_forms(ctx, by_design)  # reported, never a failure
    lost = Report()
    lost.make(STEP, "fp16/decoder", tmp_path / "gqa", "decoder.onnx")
    if strict:
        with pytest.raises(FusionIncomplete) as exc:
            record_forms(ctx, lost)
        assert exc.value.exit_code == 1
        assert exc.value.format_message().splitlines()[:2] == [
            "1 graph form lost (fusion.strict)",
            f"fp16/decoder: step: no {IO.attention_mask} input or no {IO.logits} output"]
    else:
        record_forms(ctx, lost)
        assert [(m["graph"], m["loses"]) for m in build.forms["not_made"]] == [("fp32/decoder", False),
                                                                              ("fp16/decoder", True)]
        assert "  fp16/decoder: step: no attention_mask input or no logits output (lost: --strict fails)" \
            in build.table().splitlines()

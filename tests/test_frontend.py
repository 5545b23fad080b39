"""The mel front-end graph equals the numpy reference, and composes in front of the encoder."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from webbuild.build.frontend import add_mel_frontend, mel_graph
from webbuild.errors import BuildError
from webbuild.reference.mel import log_mel


@pytest.fixture(scope="module")
def frontend():
    model = mel_graph(17)
    onnx.checker.check_model(model)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("samples", [201, 1000, 16000 * 3 + 77])
def test_graph_matches_numpy_front_end(frontend, samples):
    pcm = (np.random.RandomState(samples).randn(samples) * 0.1).astype(np.float32)
    got = frontend.run(None, {"pcm": pcm[None]})[0][0]
    np.testing.assert_allclose(got, log_mel(pcm), atol=1e-4)


def test_silence_then_speech_keeps_the_dynamic_range_floor(frontend):
    pcm = (np.random.RandomState(0).randn(16000 * 2) * 0.2).astype(np.float32)
    pcm[:16000] = 0
    got = frontend.run(None, {"pcm": pcm[None]})[0][0]
    want = log_mel(pcm)
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert want.min() == pytest.approx(want.max() - 2.0, abs=1e-5)  # the max - 8 floor, scaled by 1/4


def test_encoder_takes_pcm(zoo_export, tmp_path):
    src = zoo_export("split") / "encoder.onnx"
    add_mel_frontend(src, tmp_path / "encoder.onnx")
    pcm_enc = ort.InferenceSession(str(tmp_path / "encoder.onnx"), providers=["CPUExecutionProvider"])
    mel_enc = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    assert [i.name for i in pcm_enc.get_inputs()] == ["pcm"]
    assert [o.name for o in pcm_enc.get_outputs()] == ["audio_features"]
    pcm = (np.random.RandomState(1).randn(16000 * 2 + 500) * 0.1).astype(np.float32)
    got = pcm_enc.run(None, {"pcm": pcm[None]})[0]
    want = mel_enc.run(None, {"mel": log_mel(pcm)[None]})[0]
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_rejects_encoder_without_mel_input(zoo_export, tmp_path):
    with pytest.raises(BuildError, match="expected one input named 'mel'"):
        add_mel_frontend(zoo_export("split") / "decoder_step.onnx", tmp_path / "x.onnx")


def test_external_weights_are_copied_not_loaded(zoo_export, tmp_path):
    """An encoder whose weights live in a data file (the fused encoder's) keeps them in one: the
    front-end is spliced into the graph alone and the file is copied beside the output."""
    src = zoo_export("split") / "encoder.onnx"
    model = onnx.load(str(src))
    (tmp_path / "in").mkdir()
    onnx.save(model, str(tmp_path / "in" / "enc.onnx"), save_as_external_data=True, location="w.bin")
    add_mel_frontend(tmp_path / "in" / "enc.onnx", tmp_path / "encoder.onnx")
    assert (tmp_path / "encoder.onnx.data").read_bytes() == (tmp_path / "in" / "w.bin").read_bytes()
    assert (tmp_path / "encoder.onnx").stat().st_size < 1_000_000
    add_mel_frontend(src, tmp_path / "inline.onnx")
    pcm = (np.random.RandomState(2).randn(16000 * 3) * 0.1).astype(np.float32)[None]
    got, want = (ort.InferenceSession(str(tmp_path / n), providers=["CPUExecutionProvider"]).run(None, {"pcm": pcm})[0]
                 for n in ("encoder.onnx", "inline.onnx"))
    np.testing.assert_array_equal(got, want)

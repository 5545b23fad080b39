"""The mel front-end graph equals the numpy reference, and composes in front of the encoder."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from webbuild.errors import BuildError
from webbuild.forms.mel_frontend import add_mel_frontend, mel_graph
from webbuild.reference.mel import DEFAULT_LEAD_MS, LEAD_METADATA, lead_length, lead_samples, log_mel
from webbuild.reference.transcribe import Transcriber

LEAD = lead_samples(DEFAULT_LEAD_MS)


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    onnx.checker.check_model(model)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def frontend():
    return session(mel_graph(17))


@pytest.fixture(scope="module")
def led_frontend():
    return session(mel_graph(17, LEAD))


@pytest.mark.parametrize("samples", [201, 1000, 16000 * 3 + 77])
@pytest.mark.parametrize("pause", [0, 640, LEAD + 160])
def test_graph_matches_numpy_front_end(frontend, led_frontend, samples, pause):
    """Without a lead, and with one: whole, topped up (the chunk starts with some background), none."""
    pcm = (np.random.RandomState(samples).randn(samples) * 0.1).astype(np.float32)
    pcm[samples // 3:samples // 3 + 200] *= 0.01  # a quiet stretch: the lead's level
    pcm[:pause] *= 0.01  # a pause at the start
    got = frontend.run(None, {"pcm": pcm[None]})[0][0]
    np.testing.assert_allclose(got, log_mel(pcm), atol=1e-4)
    got = led_frontend.run(None, {"pcm": pcm[None]})[0][0]
    assert got.shape[1] == (lead_length(pcm, LEAD) + samples) // 160
    np.testing.assert_allclose(got, log_mel(pcm, LEAD), atol=1e-4)


def test_no_lead_is_the_upstream_graph(frontend):
    """Lead 0 adds no node: a model.yaml with encoder.lead_ms 0 builds the graph of before."""
    assert [n.op_type for n in mel_graph(17).graph.node][:2] == ["Unsqueeze", "Pad"]
    assert "Concat" in [n.op_type for n in mel_graph(17, LEAD).graph.node]


def test_silence_then_speech_keeps_the_dynamic_range_floor(frontend):
    pcm = (np.random.RandomState(0).randn(16000 * 2) * 0.2).astype(np.float32)
    pcm[:16000] = 0
    got = frontend.run(None, {"pcm": pcm[None]})[0][0]
    want = log_mel(pcm)
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert want.min() == pytest.approx(want.max() - 2.0, abs=1e-5)  # the max - 8 floor, scaled by 1/4


@pytest.mark.parametrize("lead", [0, LEAD])
def test_encoder_takes_pcm(zoo_export, tmp_path, lead):
    src = zoo_export("qwen3-asr-split") / "encoder.onnx"
    add_mel_frontend(src, tmp_path / "encoder.onnx", lead)
    pcm_enc = ort.InferenceSession(str(tmp_path / "encoder.onnx"), providers=["CPUExecutionProvider"])
    mel_enc = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    assert [i.name for i in pcm_enc.get_inputs()] == ["pcm"]
    assert [o.name for o in pcm_enc.get_outputs()] == ["audio_features"]
    pcm = (np.random.RandomState(1).randn(16000 * 2 + 500) * 0.1).astype(np.float32)
    got = pcm_enc.run(None, {"pcm": pcm[None]})[0]
    want = mel_enc.run(None, {"mel": log_mel(pcm, lead)[None]})[0]
    np.testing.assert_allclose(got, want, atol=1e-4)
    # the graph says how much lead it puts in, so the reference expects its audio-token count
    meta = pcm_enc.get_modelmeta().custom_metadata_map
    assert int(meta.get(LEAD_METADATA, 0)) == lead
    assert Transcriber(pcm_enc, None, None, frozenset()).front_end_lead == lead


def test_rejects_encoder_without_mel_input(zoo_export, tmp_path):
    with pytest.raises(BuildError, match="expected one input named 'mel'"):
        add_mel_frontend(zoo_export("qwen3-asr-split") / "decoder_step.onnx", tmp_path / "x.onnx")


def test_external_weights_are_copied_not_loaded(zoo_export, tmp_path):
    """An encoder whose weights live in a data file (the fused encoder's) keeps them in one: the
    front-end is spliced into the graph alone and the file is copied beside the output."""
    src = zoo_export("qwen3-asr-split") / "encoder.onnx"
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

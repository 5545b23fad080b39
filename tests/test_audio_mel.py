"""WAV reading/resampling and the mel front-end against the upstream feature extractor."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.io import wavfile

from webbuild.errors import AudioError
from webbuild.reference.audio import read_wav
from webbuild.reference.mel import log_mel


def tone(rate: int, seconds: float, freq: float = 440.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


@pytest.mark.parametrize("rate", [8000, 16000, 22050, 44100, 48000])
def test_any_rate_stereo_int16_becomes_16k_mono(tmp_path, rate):
    mono = tone(rate, 1.5)
    stereo = np.stack([mono, mono], axis=1)
    wavfile.write(tmp_path / "a.wav", rate, (stereo * 32767).astype(np.int16))
    pcm = read_wav(tmp_path / "a.wav")
    assert pcm.dtype == np.float32 and pcm.ndim == 1
    assert abs(len(pcm) - 24000) <= 1
    spectrum = np.abs(np.fft.rfft(pcm[2000:18000]))
    assert abs(np.argmax(spectrum) * 16000 / 16000 - 440) <= 2  # the tone survives resampling


def test_float32_wav(tmp_path):
    wavfile.write(tmp_path / "f.wav", 16000, tone(16000, 0.5))
    np.testing.assert_allclose(read_wav(tmp_path / "f.wav"), tone(16000, 0.5), atol=1e-6)


def test_unreadable_and_empty_audio(tmp_path):
    (tmp_path / "x.wav").write_bytes(b"RIFF....WAVEjunk")
    with pytest.raises(AudioError, match="x.wav"):
        read_wav(tmp_path / "x.wav")
    wavfile.write(tmp_path / "e.wav", 16000, np.zeros(0, np.int16))
    with pytest.raises(AudioError, match="no samples"):
        read_wav(tmp_path / "e.wav")


def test_log_mel_matches_upstream_feature_extractor():
    fe_module = pytest.importorskip("transformers.models.qwen3_asr.feature_extraction_qwen3_asr")
    pcm = (np.random.RandomState(0).randn(16000 * 2 + 77) * 0.1).astype(np.float32)
    ours = log_mel(pcm)
    theirs = fe_module.Qwen3ASRFeatureExtractor()._torch_extract_fbank_features(pcm)
    assert ours.shape == theirs.shape == (128, len(pcm) // 160)
    np.testing.assert_allclose(ours, theirs, atol=1e-4)

"""WAV reading/resampling and the mel front-end against the upstream feature extractor."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.io import wavfile

from webbuild.errors import AudioError
from webbuild.reference import wav
from webbuild.reference.audio import read_wav
from webbuild.reference.mel import frame_count, lead_length, lead_noise, log_mel, quiet_level, with_lead


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


def test_live_capture_is_written_without_scipy(tmp_path):
    """`webbuild verify`'s live check writes the page's capture as a float WAV with webbuild's own writer: the
    verify extra has no scipy (it once imported scipy.io.wavfile and crashed there). Run where scipy cannot be
    imported; the file must hold the samples exactly, as scipy's reader sees them too."""
    captured = tone(48000, 0.25, 300.0)
    np.save(tmp_path / "captured.npy", captured)
    code = ("import sys, numpy as np; from pathlib import Path; sys.modules['scipy'] = None\n"
            "from webbuild.tools.verify.live import LiveRun, capture_wav\n"
            f"run = LiveRun({{}}, 'fp32', np.load({str(tmp_path / 'captured.npy')!r}), 48000, True, 0)\n"
            f"print(capture_wav(run, Path({str(tmp_path)!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    rate, samples = wavfile.read(out.stdout.strip())
    assert rate == 48000 and samples.dtype == np.float32
    np.testing.assert_array_equal(samples, captured)
    info, blocks = wav.blocks(Path(out.stdout.strip()))
    assert (info.rate, info.channels, info.encoding, info.bits) == (48000, 1, wav.FLOAT, 32)
    np.testing.assert_array_equal(np.concatenate(list(blocks)), captured)


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


def test_lead_is_fixed_noise_at_the_quietest_window_level():
    """The lead (issue 17) is a pause at the clip's own background level: the fixed noise scaled by the
    RMS of the quietest 10 ms window; the features of the audio after it barely change."""
    rng = np.random.RandomState(3)
    pcm = (rng.randn(16000) * 0.2).astype(np.float32)
    pcm[8000:8160] = (rng.randn(160) * 0.002).astype(np.float32)  # one quiet window
    level = np.sqrt(np.mean(pcm[8000:8160].astype(np.float64) ** 2))
    assert quiet_level(pcm) == pytest.approx(level, rel=1e-5)
    led = with_lead(pcm, 1600)
    np.testing.assert_array_equal(led[1600:], pcm)
    np.testing.assert_allclose(led[:1600], lead_noise(1600) * quiet_level(pcm), rtol=1e-6)
    assert np.std(lead_noise(16000)) == pytest.approx(1.0, abs=0.02)
    feats = log_mel(pcm, 1600)
    assert lead_length(pcm, 1600) == 1600
    assert feats.shape == (128, frame_count(len(pcm), 1600)) == (128, 110)
    assert feats[:, :8].mean() < feats[:, 20:].mean() - 0.5  # the lead is quiet next to the speech
    np.testing.assert_array_equal(log_mel(pcm, 0), log_mel(pcm))


@pytest.mark.parametrize("pause", [0, 480, 1600, 3200])
def test_lead_tops_up_the_pause_a_chunk_starts_with(pause):
    """A chunk that starts with background (within 6 dB of its quietest window) gets only the rest
    of the lead: the pause before its first word is max(lead, the pause it had)."""
    rng = np.random.RandomState(4)
    pcm = (rng.randn(16000) * 0.2).astype(np.float32)
    pcm[8000:8160] = (rng.randn(160) * 0.002).astype(np.float32)  # a pause between words: the background
    pcm[:pause] = (rng.randn(pause) * 0.002).astype(np.float32)
    assert lead_length(pcm, 1600) == max(0, 1600 - pause)
    assert len(with_lead(pcm, 1600)) == len(pcm) + max(0, 1600 - pause)
    # exact zeros in front: they are the quietest, so they alone are background, and the lead is zeros
    silent = np.concatenate([np.zeros(800, np.float32), pcm])
    assert lead_length(silent, 1600) == 800
    np.testing.assert_array_equal(with_lead(silent, 1600)[:1600], 0)


def test_lead_needs_a_whole_window():
    with pytest.raises(ValueError, match="too short for a lead"):
        log_mel(np.ones(100, np.float32), 1600)
    with pytest.raises(ValueError, match="0 or more"):
        log_mel(np.ones(1000, np.float32), -1)

"""The Qwen3-ASR log-mel front-end in numpy (the reference every other implementation matches).

16 kHz, n_fft 400, hop 160, periodic Hann window, centred frames with reflect padding, power
spectrum, 128 Slaney mel bins over 0-8000 Hz, log10 clamped at 1e-10, floor at max - 8,
then (x + 4) / 4. The last STFT frame is dropped, so T = len(pcm) // 160.
"""

from __future__ import annotations

import functools

import numpy as np

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160
N_MELS = 128


def _hz_to_mel(f):
    f = np.asarray(f, dtype=np.float64)
    lin = f / (200.0 / 3)
    log = 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(f >= 1000.0, log, lin)


def _mel_to_hz(m):
    m = np.asarray(m, dtype=np.float64)
    lin = m * (200.0 / 3)
    log = 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0))
    return np.where(m >= 15.0, log, lin)


@functools.lru_cache(maxsize=1)
def mel_filters() -> np.ndarray:
    """Slaney-normalised triangular filters, shape [N_FFT // 2 + 1, N_MELS] (float32)."""
    fft_freqs = np.linspace(0, SAMPLE_RATE / 2, N_FFT // 2 + 1)
    mel_pts = np.linspace(_hz_to_mel(0.0), _hz_to_mel(8000.0), N_MELS + 2)
    filt_freqs = _mel_to_hz(mel_pts)
    diff = np.diff(filt_freqs)
    slopes = filt_freqs[None, :] - fft_freqs[:, None]
    down = -slopes[:, :-2] / diff[:-1]
    up = slopes[:, 2:] / diff[1:]
    fb = np.maximum(0.0, np.minimum(down, up))
    enorm = 2.0 / (filt_freqs[2 : N_MELS + 2] - filt_freqs[:N_MELS])
    return (fb * enorm[None, :]).astype(np.float32)


def hann_window() -> np.ndarray:
    n = np.arange(N_FFT)
    return (0.5 - 0.5 * np.cos(2 * np.pi * n / N_FFT)).astype(np.float32)


def log_mel(pcm: np.ndarray) -> np.ndarray:
    """Log-mel features [N_MELS, len(pcm) // HOP] of 16 kHz mono float PCM."""
    pcm = np.asarray(pcm, dtype=np.float32)
    if pcm.ndim != 1:
        raise ValueError(f"expected mono PCM (1-D), got shape {pcm.shape}")
    if len(pcm) <= N_FFT // 2:  # reflect padding needs more samples than it pads
        raise ValueError(f"audio too short: {len(pcm)} samples, need at least {N_FFT // 2 + 1}")
    padded = np.pad(pcm, N_FFT // 2, mode="reflect")
    n_frames = 1 + (len(padded) - N_FFT) // HOP
    idx = np.arange(N_FFT)[None, :] + HOP * np.arange(n_frames)[:, None]
    frames = padded[idx] * hann_window()[None, :]
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2  # [frames, 201]
    mel = (power[:-1] @ mel_filters()).T  # drop the last frame -> [128, T]
    logm = np.log10(np.maximum(mel, 1e-10))
    logm = np.maximum(logm, logm.max() - 8.0)
    return ((logm + 4.0) / 4.0).astype(np.float32)

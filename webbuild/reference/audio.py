"""Read WAV files of any sample rate, channel count and sample format as 16 kHz mono float32."""

from __future__ import annotations

import warnings
from math import gcd
from pathlib import Path

import numpy as np
from scipy.io import wavfile
from scipy.signal import resample_poly

from webbuild.errors import AudioError
from webbuild.reference.mel import SAMPLE_RATE


def read_wav(path: Path) -> np.ndarray:
    """16 kHz mono float32 PCM in [-1, 1] from a WAV file."""
    path = Path(path)
    if not path.is_file():
        raise AudioError(f"{path}: no such file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", wavfile.WavFileWarning)
            rate, data = wavfile.read(str(path))
    except Exception as exc:  # scipy's reader fails on a damaged header with whatever it meets first
        raise AudioError(f"{path}: not a readable WAV file ({exc or type(exc).__name__}); convert it to WAV "
                         "(PCM or float)") from None
    if rate <= 0:
        raise AudioError(f"{path}: its header gives a sample rate of {rate} Hz; convert it to WAV again")
    pcm = to_float(data)
    if pcm.ndim == 2:
        pcm = pcm.mean(axis=1)
    if pcm.size == 0:
        raise AudioError(f"{path}: the WAV file holds no samples")
    return resample(pcm, rate)


def to_float(data: np.ndarray) -> np.ndarray:
    if data.dtype == np.uint8:
        return (data.astype(np.float32) - 128.0) / 128.0
    if np.issubdtype(data.dtype, np.integer):
        return data.astype(np.float32) / float(-np.iinfo(data.dtype).min)
    return data.astype(np.float32)


def resample(pcm: np.ndarray, rate: int) -> np.ndarray:
    if rate == SAMPLE_RATE:
        return pcm.astype(np.float32)
    g = gcd(SAMPLE_RATE, rate)
    return resample_poly(pcm, SAMPLE_RATE // g, rate // g).astype(np.float32)


def write_wav(path: Path, pcm: np.ndarray, rate: int = SAMPLE_RATE) -> None:
    """16-bit PCM WAV (the sample clips the site ships)."""
    pcm16 = np.clip(np.round(np.asarray(pcm) * 32767.0), -32768, 32767).astype(np.int16)
    wavfile.write(str(path), rate, pcm16)

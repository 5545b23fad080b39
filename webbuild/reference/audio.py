"""WAV files of any sample rate, channel count and sample format as 16 kHz mono float32.

Parsing and its checks: webbuild.reference.wav; resampling: webbuild.reference.resample (the page runs
the JS twins of both, so a file gives the same samples here and in the browser).
"""

from __future__ import annotations

import struct
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from webbuild.reference import wav
from webbuild.reference.mel import SAMPLE_RATE
from webbuild.reference.resample import Resampler


def stream_wav(path: Path, frames_per_block: int = 1 << 16) -> Iterator[np.ndarray]:
    """The file as 16 kHz mono float32 blocks, read and resampled as they are consumed: memory bounded by the
    block, not the recording. The header is checked before the first block is asked for."""
    info, blocks = wav.blocks(Path(path), frames_per_block)
    return _resampled(info.rate, blocks)


def _resampled(rate: int, blocks: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
    r = Resampler(rate, SAMPLE_RATE)
    for block in blocks:
        yield r.push(block).astype(np.float32)
    yield r.finish().astype(np.float32)


def read_wav(path: Path) -> np.ndarray:
    """16 kHz mono float32 PCM in [-1, 1] from a WAV file."""
    return np.concatenate(list(stream_wav(path)))


def write_wav(path: Path, pcm: np.ndarray, rate: int = SAMPLE_RATE) -> None:
    """16-bit PCM WAV (the sample clips the site ships): `pcm` [n] mono or [n, channels], frames interleaved."""
    pcm16 = np.clip(np.round(np.asarray(pcm) * 32767.0), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as f:  # the standard library's writer: the main install has no scipy
        f.setnchannels(pcm16.shape[1] if pcm16.ndim == 2 else 1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(pcm16.tobytes())


def write_float_wav(path: Path, pcm: np.ndarray, rate: int) -> None:
    """32-bit float mono WAV (format 3), the samples kept exactly: the page's live capture, which
    `webbuild transcribe --live` must read as the page heard it. The standard library's wave writes PCM only."""
    data = np.asarray(pcm, "<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    with open(path, "wb") as f:
        f.write(b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(data)) + b"WAVE")
        f.write(b"fmt " + struct.pack("<I", len(fmt)) + fmt)
        f.write(b"data" + struct.pack("<I", len(data)) + data)

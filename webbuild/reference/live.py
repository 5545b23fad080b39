"""Audio for checking the live mode: clips joined with pauses, where each clip's speech ends, and where a
capture of that audio (a browser's fake microphone plays the file from a moment of its own) begins in it.

A clip's speech ends at the end of its last 20 ms frame within 20 dB of its loudest (the chunk policy's
`below_peak`): the end of its last word, as the test audio knows it. `webbuild verify` and tests/e2e/test_live.py
measure the delay from there to the word's first appearance in the page.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from webbuild.reference.chunk import DEFAULT_POLICY
from webbuild.reference.mel import SAMPLE_RATE

LEAD_SECONDS = 1.0  # quiet before the first clip (the capture starts somewhere in it)
PAUSE_SECONDS = 1.5  # quiet after each clip: it ends the clip's live chunk


@dataclass(frozen=True)
class Span:
    """A clip in the joined audio, in 16 kHz samples: where it starts, where its speech ends, where it ends."""

    start: int
    speech_end: int
    end: int


def speech_end(pcm: np.ndarray, frame: int = int(DEFAULT_POLICY.frame_seconds * SAMPLE_RATE)) -> int:
    """The end of the last frame of `pcm` whose energy is within below_peak of the loudest frame's."""
    count = len(pcm) // frame
    energy = (pcm[:count * frame].astype(np.float64).reshape(count, frame) ** 2).sum(axis=1)
    loud = np.nonzero(energy >= energy.max() * DEFAULT_POLICY.below_peak)[0]
    return int(loud[-1] + 1) * frame


def join_with_pauses(clips: list[np.ndarray], seed: int = 0) -> tuple[np.ndarray, list[Span]]:
    """16 kHz clips one after another, LEAD_SECONDS of quiet before and PAUSE_SECONDS after each, as float32. The
    quiet is noise at the level of the clip's own background after its speech (a room goes on sounding as it
    did; a drop to digital silence would be a change the chunk policy hears)."""
    rng = np.random.default_rng(seed)
    clips = [np.asarray(c, np.float64) for c in clips]

    def quiet(seconds: float, clip: np.ndarray) -> np.ndarray:
        tail = clip[speech_end(clip):]
        level = float(np.sqrt(np.mean(tail ** 2))) if len(tail) else 0.0
        return level * rng.standard_normal(int(seconds * SAMPLE_RATE))

    parts, spans, at = [quiet(LEAD_SECONDS, clips[0])], [], int(LEAD_SECONDS * SAMPLE_RATE)
    for clip in clips:
        spans.append(Span(at, at + speech_end(clip), at + len(clip)))
        parts += [clip, quiet(PAUSE_SECONDS, clip)]
        at += len(clip) + int(PAUSE_SECONDS * SAMPLE_RATE)
    return np.concatenate(parts).astype(np.float32), spans


def capture_offset(captured: np.ndarray, played: np.ndarray) -> int:
    """Where `captured` (16 kHz) begins in `played` (16 kHz), in samples: the lag of their cross-correlation's
    peak (negative: the capture began before the audio)."""
    n = 1 << int(np.ceil(np.log2(len(captured) + len(played))))
    spectrum = np.fft.rfft(played.astype(np.float64), n) * np.conj(np.fft.rfft(captured.astype(np.float64), n))
    corr = np.fft.irfft(spectrum, n)
    lag = int(np.argmax(corr))
    return lag if lag < n - len(captured) else lag - n

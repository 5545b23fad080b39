"""Speech detection with Silero VAD (its ONNX model v5, MIT licence), the one policy of the page
(webbuild/template/runtime/vad.js, which reads it from runtime.json's `vad`) and of `webbuild transcribe`.

The 16 kHz audio is read in windows of `window` samples (512: 32 ms) from its first sample; each window goes to the
model after the `context` samples before it (64; zeros before the first), with the recurrent state the previous
window left (zeros at first): Silero's own wrapper does the same. A window shorter than `window` at the end of a file
is padded with zeros; live audio judges complete windows only. Each window gets a speech probability.

Segments follow Silero's get_speech_timestamps with its defaults: speech starts at a window of probability at
least `threshold`, and ends at the first window below `neg_threshold` (threshold - 0.15) after which the
probability stays below `threshold` for `min_silence_seconds`; a segment shorter than `min_speech_seconds` is
dropped; each segment is widened by `pad_seconds` either side (half the gap where two would meet). Silero's
probabilities are compared as float32 values in both languages, so the page and the reference find the same
segments (tests/test_vad.py).

What the segments decide (webbuild.reference.chunk): segments less than `merge_seconds` apart are one stretch of
speech; a file's chunks (the chunk policy's) keep only their parts within a stretch, so what lies between
stretches is not transcribed; a live chunk holds speech only where its own windows have a segment. Audio without
speech gives an empty transcript and no decode.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

VAD_FILE = "silero_vad_v5.onnx"  # vendored from npm's @ricky0123/vad-web (webbuild/site/vad.lock.json)


@dataclass(frozen=True)
class VadPolicy:
    """Silero's usual settings at 16 kHz (runtime.json `vad`; the module's docstring)."""

    file: str = VAD_FILE
    sample_rate: int = 16000
    window: int = 512
    context: int = 64
    threshold: float = 0.5
    neg_threshold: float = 0.35
    min_speech_seconds: float = 0.25
    min_silence_seconds: float = 0.1
    pad_seconds: float = 0.03
    merge_seconds: float = 1.0  # segments closer are one stretch of speech (webbuild.reference.chunk.stretches)

    def as_json(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, runtime: dict | None) -> VadPolicy | None:
        """A built site's policy: runtime.json's `vad`; None where the site was built without speech detection."""
        return cls(**runtime["vad"]) if runtime and runtime.get("vad") else None


DEFAULT_VAD = VadPolicy()


def vad_model_path() -> Path:
    """The vendored model file (package data, checked against its lock)."""
    from webbuild.site.ort_files import vad_dir

    return vad_dir() / VAD_FILE


class Vad:
    """A Silero VAD session on onnxruntime CPU; `stream()` gives each window's probability as audio arrives."""

    def __init__(self, model: Path | None = None, policy: VadPolicy = DEFAULT_VAD):
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.intra_op_num_threads = 1  # a window is tiny: threads cost more than they give
        self.session = ort.InferenceSession(str(model or vad_model_path()), opts, providers=["CPUExecutionProvider"])
        self.policy = policy

    def stream(self) -> VadStream:
        return VadStream(self)

    def probabilities(self, blocks: Iterable[np.ndarray]) -> tuple[np.ndarray, int]:
        """Each window's probability over a stream of 16 kHz blocks (the last window padded), and the samples."""
        stream = self.stream()
        for block in blocks:
            stream.feed(block)
        stream.finish()
        return np.asarray(stream.probs, np.float32), stream.samples

    def segments(self, pcm: np.ndarray) -> list[tuple[int, int]]:
        probs, samples = self.probabilities([pcm])
        return speech_segments(probs, samples, self.policy)

    def stretches(self, segments: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The segments joined where less than `merge_seconds` apart (webbuild.reference.chunk.stretches)."""
        from webbuild.reference.chunk import stretches

        return stretches(segments, round(self.policy.merge_seconds * self.policy.sample_rate))


class VadStream:
    """Windows judged as audio arrives: `feed(block)` appends the probabilities of the complete windows,
    `finish()` that of the padded last one."""

    def __init__(self, vad: Vad):
        p = vad.policy
        self.run_ = vad.session.run
        self.window, self.rate = p.window, np.array(p.sample_rate, np.int64)
        self.context = np.zeros(p.context, np.float32)
        self.state = np.zeros((2, 1, 128), np.float32)
        self.pending = np.zeros(0, np.float32)
        self.probs: list[float] = []
        self.samples = 0

    def feed(self, block: np.ndarray) -> None:
        block = np.asarray(block, np.float32)
        self.samples += len(block)
        self.pending = np.concatenate([self.pending, block])
        while len(self.pending) >= self.window:
            self._judge(self.pending[:self.window])
            self.pending = self.pending[self.window:]

    def finish(self) -> None:
        if len(self.pending):
            self._judge(np.concatenate([self.pending, np.zeros(self.window - len(self.pending), np.float32)]))
            self.pending = self.pending[:0]

    def _judge(self, window: np.ndarray) -> None:
        x = np.concatenate([self.context, window])[None]
        out, self.state = self.run_(None, {"input": x, "state": self.state, "sr": self.rate})
        self.context = window[-len(self.context):]
        self.probs.append(float(np.float32(out[0, 0])))


def speech_segments(probs: np.ndarray, samples: int, policy: VadPolicy = DEFAULT_VAD) -> list[tuple[int, int]]:
    """[start, end) sample ranges of speech in audio of `samples` samples whose windows have these probabilities
    (Silero's get_speech_timestamps; the module's docstring)."""
    rate, w = policy.sample_rate, policy.window
    min_speech = round(policy.min_speech_seconds * rate)
    min_silence = round(policy.min_silence_seconds * rate)
    pad = round(policy.pad_seconds * rate)
    segments: list[list[int]] = []
    start, temp_end, triggered = 0, 0, False
    for i, p in enumerate(probs):
        p = float(p)
        if p >= policy.threshold and temp_end:
            temp_end = 0
        if p >= policy.threshold and not triggered:
            triggered, start = True, w * i
            continue
        if p < policy.neg_threshold and triggered:
            temp_end = temp_end or w * i
            if w * i - temp_end < min_silence:
                continue
            if temp_end - start > min_speech:
                segments.append([start, temp_end])
            start, temp_end, triggered = 0, 0, False
    if triggered and samples - start > min_speech:
        segments.append([start, samples])
    return _padded(segments, samples, pad)


def _padded(segments: list[list[int]], samples: int, pad: int) -> list[tuple[int, int]]:
    """Each segment widened by `pad` either side, by half the gap where two would meet."""
    for i, s in enumerate(segments):
        if i == 0:
            s[0] = max(0, s[0] - pad)
        if i + 1 < len(segments):
            gap = segments[i + 1][0] - s[1]
            if gap < 2 * pad:
                s[1] += gap // 2
                segments[i + 1][0] = max(0, segments[i + 1][0] - gap // 2)
            else:
                s[1] = min(samples, s[1] + pad)
                segments[i + 1][0] = max(0, segments[i + 1][0] - pad)
        else:
            s[1] = min(samples, s[1] + pad)
    return [(a, b) for a, b in segments]


def window_speech(probs: np.ndarray, start: int, end: int, policy: VadPolicy = DEFAULT_VAD) -> bool:
    """Whether the windows lying wholly within [start, end) have a speech segment (a live chunk's test)."""
    w = policy.window
    first, last = -(-start // w), end // w
    return bool(speech_segments(np.asarray(probs[first:last]), (last - first) * w, policy)) if last > first else False

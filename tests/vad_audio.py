"""Audio for the speech-detection tests (issue 50): real espeak-ng speech with pauses, and what must give no text:
white noise, silence (zeros and low noise) and music-like tones (sine notes under envelopes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from webbuild.reference.audio import write_wav
from webbuild.reference.resample import resample
from webbuild.train.speech import espeak_wav, parse_wav

SR = 16000


def speech(text: str, voice: str = "en-us") -> np.ndarray:
    """espeak-ng's reading of `text` at 16 kHz."""
    pcm, rate = parse_wav(espeak_wav(text, voice, 160, 50))
    return resample(pcm, rate, SR).astype(np.float32)


# A rare name (webbuild.train.names: a pseudo-word of the language's plain syllables) the example spells only when
# its context gives it: it was trained with such names in a fifth of its clips' contexts (TRAINING.md)
NAME_SENTENCE, NAME = "the letter from Tabunisa arrived", "Tabunisa"
NAME_CONTEXT = f"{NAME}, Quill — Москва"  # the name among distractors, as in training


def name_clip(path: Path) -> Path:
    """espeak-ng saying NAME_SENTENCE, written to `path` (16 kHz WAV): the clip whose answer the context changes."""
    write_wav(path, speech(NAME_SENTENCE), SR)
    return path


def white_noise(seconds: float, level: float = 0.3, seed: int = 0) -> np.ndarray:
    return (level * np.random.default_rng(seed).standard_normal(int(seconds * SR))).clip(-1, 1).astype(np.float32)


def silence(seconds: float, level: float = 0.0, seed: int = 1) -> np.ndarray:
    """Zeros, or low noise at `level` (a quiet room)."""
    return white_noise(seconds, level, seed) if level else np.zeros(int(seconds * SR), np.float32)


def tones(seconds: float, seed: int = 2) -> np.ndarray:
    """Music-like: notes of 0.15-0.6 s, each a chord of 1-3 tones of an equal-tempered scale (440-1760 Hz, with a
    second harmonic) under a 5-ms attack and an exponential decay, overlapping."""
    rng = np.random.default_rng(seed)
    out = np.zeros(int(seconds * SR) + SR, np.float64)
    at = 0
    while at < seconds * SR:
        n = int(rng.uniform(0.15, 0.6) * SR)
        t = np.arange(n) / SR
        envelope = np.minimum(1, t / 0.005) * np.exp(-t * rng.uniform(4, 10))
        note = np.zeros(n)
        for _ in range(rng.integers(1, 4)):
            f = 440 * 2 ** (rng.integers(0, 24) / 12)
            note += np.sin(2 * np.pi * f * t) + 0.3 * np.sin(2 * np.pi * 2 * f * t)
        out[at:at + n] += 0.15 * envelope * note
        at += int(n * rng.uniform(0.5, 1.0))
    return out[:int(seconds * SR)].clip(-1, 1).astype(np.float32)


def mixed(seed: int = 0) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Speech with pauses between stretches of silence, low noise, white noise and tones; and where each
    sentence lies (samples)."""
    said = ["the station was quiet this morning", "bring the office radio", "harmony and surprise",
            "one audience, two daughters"]
    fillers = [silence(1.0), silence(1.5, 0.002), white_noise(2.0, 0.1, seed), tones(2.0, seed), silence(0.7)]
    parts, where, at = [], [], 0
    for i, text in enumerate(said):
        parts.append(fillers[i])
        at += len(fillers[i])
        s = speech(text)
        parts.append(s)
        where.append((at, at + len(s)))
        at += len(s)
    parts.append(fillers[-1])
    return np.concatenate(parts), where

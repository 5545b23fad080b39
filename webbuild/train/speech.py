"""espeak-ng speech synthesis with voice, rate, pitch, gain, noise and silence variation.

Output is 16 kHz mono float32, the rate the Qwen3-ASR front-end expects. espeak-ng writes
22050 Hz WAV; 16000/22050 = 320/441 gives an exact polyphase resampling.

espeak-ng starts every utterance with about 13 ms of digital silence; it is trimmed, so a style's
leading silence is all the silence there is. Training clips (`augment`) vary two things the held-out
clips keep fixed (issue 17): a share starts with speech at the first sample, or a few ms into it
(chunks of longer audio and uploaded files often do, and a model that never heard it garbles the
first word), and a share has silences of exact zeros, noise over the speech only (padded files; and
a chunk with no background gets a lead of zeros from the front-end, webbuild.reference.mel).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

import numpy as np

from webbuild.train.languages import ENGLISH

SAMPLE_RATE = 16000
VOICES = ENGLISH.voices  # random_style's default: the English-only clips keep their voices
VARIANTS = ("", "+m1", "+m2", "+m3", "+m4", "+m7", "+f1", "+f2", "+f3", "+f4")
RATE_WPM = (130, 190)
PITCH = (30, 70)
GAIN_DB = (-6.0, 3.0)
SNR_DB = (20.0, 40.0)
SILENCE_S = (0.05, 0.4)  # leading and trailing, each
ONSET_SHARE = 0.35  # training clips whose speech starts at the first sample or up to CUT_S into it
CUT_S = 0.01
DIGITAL_SILENCE_SHARE = 0.15  # training clips whose silences are exact zeros
# training clips that end as speech detection cuts a chunk (webbuild.reference.vad's 30 ms pad and the chunk
# policy's keep_seconds, 100 ms): espeak-ng's trailing silence trimmed, then at most TAIL_CUT_S of it; a model that
# heard only long pauses after the speech makes up a tail after such a cut (TRAINING.md)
TAIL_CUT_SHARE = 0.25
TAIL_CUT_S = 0.13
TRIM_LEVEL = 0.01  # espeak-ng's leading silence is digital zero; speech starts above 1% of the peak
PEAK = 0.6


@dataclass(frozen=True)
class Style:
    voice: str
    rate: int
    pitch: int
    gain_db: float
    snr_db: float
    lead_s: float  # silence before the speech; negative: that much of the speech's start is cut
    trail_s: float
    digital_silence: bool = False  # noise over the speech only; the silences are exact zeros
    trim_tail: bool = False  # espeak-ng's trailing silence cut off first: trail_s is all there is after the speech


def random_style(rng: np.random.Generator, augment: bool = False, voices: tuple[str, ...] = VOICES) -> Style:
    """A random style in one of `voices`; with `augment` (training), ONSET_SHARE of them with speech from
    the first sample (lead 0 to -CUT_S), DIGITAL_SILENCE_SHARE with silences of exact zeros and TAIL_CUT_SHARE
    ending 0 to TAIL_CUT_S after the speech. Without, no extra number is drawn (the held-out clips keep the
    styles they always had)."""
    voice = str(rng.choice(voices)) + str(rng.choice(VARIANTS))
    rate = int(rng.integers(RATE_WPM[0], RATE_WPM[1] + 1))
    pitch = int(rng.integers(PITCH[0], PITCH[1] + 1))
    gain_db, snr_db = float(rng.uniform(*GAIN_DB)), float(rng.uniform(*SNR_DB))
    at_onset = augment and rng.random() < ONSET_SHARE
    lead_s = -float(rng.uniform(0.0, CUT_S)) if at_onset else float(rng.uniform(*SILENCE_S))
    trail_s = float(rng.uniform(*SILENCE_S))
    digital = augment and bool(rng.random() < DIGITAL_SILENCE_SHARE)
    trim_tail = augment and bool(rng.random() < TAIL_CUT_SHARE)
    if trim_tail:
        trail_s = float(rng.uniform(0.0, TAIL_CUT_S))
    return Style(voice, rate, pitch, gain_db, snr_db, lead_s, trail_s, digital, trim_tail)


def espeak_wav(text: str, voice: str, rate: int, pitch: int) -> bytes:
    cmd = ["espeak-ng", "--stdout", "-v", voice, "-s", str(rate), "-p", str(pitch), text]
    return subprocess.run(cmd, capture_output=True, check=True).stdout


def parse_wav(data: bytes) -> tuple[np.ndarray, int]:
    """16-bit mono PCM from a WAV stream; espeak-ng writes a bogus data size when piping, so the
    data chunk is taken to run to the end of the stream."""
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError("not a WAV stream")
    rate = int.from_bytes(data[24:28], "little")
    pos = 12
    while data[pos : pos + 4] != b"data":
        pos += 8 + int.from_bytes(data[pos + 4 : pos + 8], "little")
    pcm = np.frombuffer(data[pos + 8 :], dtype="<i2")
    return pcm.astype(np.float32) / 32768.0, rate


def to_16k(pcm: np.ndarray, rate: int) -> np.ndarray:
    if rate == SAMPLE_RATE:
        return pcm
    from scipy.signal import resample_poly  # the train extra's; the main install has no scipy

    g = np.gcd(SAMPLE_RATE, rate)
    return resample_poly(pcm, SAMPLE_RATE // g, rate // g).astype(np.float32)


def trim_leading_silence(pcm: np.ndarray, level: float = TRIM_LEVEL) -> np.ndarray:
    """`pcm` from its first sample above `level` times its peak."""
    loud = np.abs(pcm) > level * np.abs(pcm).max()
    return pcm[int(np.argmax(loud)):] if loud.any() else pcm


def trim_trailing_silence(pcm: np.ndarray, level: float = TRIM_LEVEL) -> np.ndarray:
    """`pcm` up to its last sample above `level` times its peak."""
    loud = np.flatnonzero(np.abs(pcm) > level * np.abs(pcm).max())
    return pcm[:int(loud[-1]) + 1] if len(loud) else pcm


def degrade(pcm: np.ndarray, style: Style, rng: np.random.Generator) -> np.ndarray:
    """Peak normalisation, silence padding (or a cut into the speech's start), gain and white noise
    at the style's SNR (relative to the speech power). espeak-ng peaks near full scale, so it is
    brought to PEAK before the gain."""
    pcm = pcm * (PEAK / (np.abs(pcm).max() + 1e-9))
    pcm = pcm[int(-style.lead_s * SAMPLE_RATE):] if style.lead_s < 0 else pcm
    if style.trim_tail:
        pcm = trim_trailing_silence(pcm)
    lead, trail = (np.zeros(int(max(s, 0.0) * SAMPLE_RATE), np.float32) for s in (style.lead_s, style.trail_s))
    power = float(np.mean(pcm**2)) + 1e-12
    out = np.concatenate([lead, pcm, trail]) * 10 ** (style.gain_db / 20)
    noise_rms = np.sqrt(power / 10 ** (style.snr_db / 10)) * 10 ** (style.gain_db / 20)
    noise = rng.normal(0.0, noise_rms, out.shape).astype(np.float32)
    if style.digital_silence:  # espeak-ng's trailing silence (not trimmed) counts as silence too
        loud = np.flatnonzero(np.abs(pcm) > TRIM_LEVEL * PEAK)
        end = len(lead) + (int(loud[-1]) + 1 if len(loud) else 0)
        noise[:len(lead)], noise[end:] = 0.0, 0.0
    out = out + noise
    return np.clip(out, -1.0, 1.0).astype(np.float32)


def synthesize(text: str, style: Style, rng: np.random.Generator) -> np.ndarray:
    """16 kHz mono float32 speech of `text` in `style`."""
    pcm, rate = parse_wav(espeak_wav(text, style.voice, style.rate, style.pitch))
    return degrade(trim_leading_silence(to_16k(pcm, rate)), style, rng)

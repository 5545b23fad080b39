"""The Qwen3-ASR log-mel front-end in numpy (the reference every other implementation matches).

16 kHz, n_fft 400, hop 160, periodic Hann window, centred frames with reflect padding, power
spectrum, 128 Slaney mel bins over 0-8000 Hz, log10 clamped at 1e-10, floor at max - 8,
then (x + 4) / 4. The last STFT frame is dropped, so T = len(pcm) // 160.

A lead may be put before the audio first, so that the chunk starts with a pause of at least `lead`
samples: a model that only heard speech after a pause garbles a first word that starts at sample 0,
and a chunk cut from longer audio or an uploaded file often does (issue 17). The lead is a pause as
such a model knows it: fixed white noise at the level of the chunk's quietest 10 ms window (its
background), as long as `lead` less the background the chunk already starts with (whole 10 ms
windows within 6 dB of the quietest), so a pause already there is not made longer than any the
model heard. Digital zeros would not do: they sit at the max - 8 floor, far below any background
the model was trained on (the tiny example transcribes worse behind 300 ms of zeros than behind
50 ms). T = (lead_length(pcm, lead) + len(pcm)) // 160. With lead 0 the features equal the
upstream Qwen3-ASR feature extractor's.
"""

from __future__ import annotations

import functools

import numpy as np

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160
N_MELS = 128
# model.yaml's default encoder.lead_ms and the training recipe's. The tiny example trained before the lead
# (pauses of 0.05-0.4 s only), on 200 held-out sentences: speech from the first sample 8.1% WER -> 2.6%;
# the same clips behind 0.3 s of noise 2.8% either way; its held-out clips (a pause first) 2.8% -> 3.5%
# (examples/tiny-asr/TRAINING.md).
DEFAULT_LEAD_MS = 300
LEAD_METADATA = "webbuild.frontend.lead_samples"  # an encoder graph's metadata: its front-end's lead
QUIET_WINDOW = HOP  # samples per window when looking for the chunk's background
QUIET_RATIO = 4.0  # a window with at most 4x the quietest one's energy (6 dB) is background
LEAD_NOISE_SEED = 0


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


def lead_samples(lead_ms: int) -> int:
    return lead_ms * SAMPLE_RATE // 1000


def lead_noise(lead: int) -> np.ndarray:
    """The lead's fixed unit-variance white noise (the graph carries the same numbers)."""
    return np.random.default_rng(LEAD_NOISE_SEED).standard_normal(lead).astype(np.float32)


def window_energies(pcm: np.ndarray) -> np.ndarray:
    """Sums of squares of `pcm`'s whole QUIET_WINDOW-sample windows (float32)."""
    n = len(pcm) // QUIET_WINDOW * QUIET_WINDOW
    if not n:
        raise ValueError(f"audio too short for a lead: {len(pcm)} samples, need at least {QUIET_WINDOW}")
    return np.square(np.asarray(pcm[:n], np.float32)).reshape(-1, QUIET_WINDOW).sum(1, dtype=np.float32)


def quiet_level(pcm: np.ndarray) -> np.float32:
    """RMS of the quietest whole QUIET_WINDOW-sample window of `pcm` (the chunk's background)."""
    return np.sqrt(window_energies(pcm).min() * np.float32(1 / QUIET_WINDOW))


def lead_length(pcm: np.ndarray, lead: int) -> int:
    """Samples of lead `pcm` gets: `lead` less the background it starts with (its leading windows
    within QUIET_RATIO of the quietest)."""
    if lead < 0:
        raise ValueError(f"lead must be 0 or more samples, got {lead}")
    if not lead:
        return 0
    energy = window_energies(pcm)
    loud = energy > energy.min() * np.float32(QUIET_RATIO)
    quiet = int(np.argmax(loud)) if loud.any() else len(energy)
    return max(0, lead - quiet * QUIET_WINDOW)


def with_lead(pcm: np.ndarray, lead: int) -> np.ndarray:
    """`pcm` behind its lead: lead_length(pcm, lead) samples of the lead noise at its quiet level."""
    pcm = np.asarray(pcm, dtype=np.float32)
    n = lead_length(pcm, lead)
    return np.concatenate([lead_noise(n) * quiet_level(pcm), pcm]) if n else pcm


def frame_count(samples: int, lead: int = 0) -> int:
    """Mel frames of `samples` samples of audio behind a lead of `lead` samples."""
    return (lead + samples) // HOP


def log_mel(pcm: np.ndarray, lead: int = 0) -> np.ndarray:
    """Log-mel features [N_MELS, (lead_length(pcm, lead) + len(pcm)) // HOP] of 16 kHz mono float PCM
    behind its lead (`with_lead`)."""
    pcm = np.asarray(pcm, dtype=np.float32)
    if pcm.ndim != 1:
        raise ValueError(f"expected mono PCM (1-D), got shape {pcm.shape}")
    pcm = with_lead(pcm, lead)
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

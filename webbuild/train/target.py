"""Speech an adapter is trained for: a voice or a speaking style the base model never heard.

A target keeps the held-out clips' random rate, pitch, gain, noise and silences and changes one
thing (the espeak-ng voice, or the rate), so its WER against the base says what that one thing costs.
Its held-out clips speak the general held-out sentences (never drawn for training) with their own
seed; its training clips speak fresh training draws (webbuild.train.adapter_data).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from webbuild.train.dataset import Clips
from webbuild.train.sentences import heldout_sentences, load_vocabulary
from webbuild.train.speech import Style, random_style, synthesize

TARGET_SEED = 20261201  # voices' other draws and noise of every target clip set
TRAIN_SEED = 7  # the adapters' training sentences; the base ran seed 1


def _voice(voice: str) -> Callable[[Style, np.random.Generator], Style]:
    return lambda style, rng: dataclasses.replace(style, voice=voice)


def _rate(low: int, high: int) -> Callable[[Style, np.random.Generator], Style]:
    return lambda style, rng: dataclasses.replace(style, rate=int(rng.integers(low, high + 1)))


# espeak-ng voices and rates outside the base's training styles (webbuild.train.speech)
TARGETS: dict[str, Callable[[Style, np.random.Generator], Style]] = {
    "lancaster": _voice("en-gb-x-gbclan"),
    "west-midlands": _voice("en-gb-x-gbcwmd"),
    "new-york": _voice("en-us-nyc"),
    "klatt": _voice("en-us+klatt"),
    "whisper": _voice("en-us+whisper"),
    "fast": _rate(260, 320),
}


def target_clips(target: str, texts: list[str], seed: int) -> Clips:
    """`texts` spoken in `target`'s style, as held-out clips are (no training augmentation)."""
    rng = np.random.default_rng(seed)
    change = TARGETS[target]
    pcms = [synthesize(t, change(random_style(rng), rng), rng) for t in texts]
    pcm16 = np.concatenate([np.round(p * 32767).astype(np.int16) for p in pcms])
    return Clips(pcm16, np.array([len(p) for p in pcms], np.int64), list(texts))


def heldout_target(target: str, count: int) -> Clips:
    """The first `count` held-out sentences in `target`'s style: never an adapter's training clip."""
    return target_clips(target, heldout_sentences(load_vocabulary(), count), TARGET_SEED)

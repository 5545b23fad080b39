"""Parallel synthesis of sentence lists into compact shards (int16 PCM + text), and loading.

A shard is one .npz: `pcm` (all clips' int16 samples concatenated), `lengths`, `texts`, `languages`
(each clip's language name). Each shard has its own seeded RNG, so the data do not depend on the number
of workers. A shard also records how it was made (`recipe`: the synthesis, augmented or plain, and its
languages), so shards of an older synthesis or another language mix are made again, not reused.
"""

from __future__ import annotations

import multiprocessing as mp
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from webbuild.train.languages import ENGLISH, LANGUAGES
from webbuild.train.speech import random_style, synthesize

SHARD_CLIPS = 500
RECIPE = 3  # bump when synthesis changes; 2: espeak-ng's leading silence trimmed, augmented styles; 3: tail cuts


@dataclass
class Clips:
    pcm: np.ndarray  # int16, all clips concatenated
    lengths: np.ndarray  # int64 samples per clip
    texts: list[str]
    languages: list[str] = field(default_factory=list)  # each clip's language name; none given: English

    def __post_init__(self):
        self.languages = list(self.languages) or [ENGLISH.name] * len(self.texts)

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.lengths)[:-1]])

    def clip(self, i: int) -> np.ndarray:
        start = int(self.offsets[i])
        return self.pcm[start : start + int(self.lengths[i])].astype(np.float32) / 32767.0


def synthesize_clips(texts: list[str], seed: int, augment: bool = False, languages: list[str] | None = None) -> Clips:
    """Clips of `texts`, each in its language's voices (`languages`: names; none: English);
    `augment`: the training styles (speech.random_style)."""
    rng = np.random.default_rng(seed)
    names = languages or [ENGLISH.name] * len(texts)
    pcms = [synthesize(t, random_style(rng, augment, LANGUAGES[name].voices), rng) for t, name in zip(texts, names)]
    pcm16 = np.concatenate([np.round(p * 32767).astype(np.int16) for p in pcms])
    return Clips(pcm16, np.array([len(p) for p in pcms], np.int64), list(texts), list(names))


def shard_seed(seed: int, k: int) -> int:
    return seed * 100_003 + k


def _shard_texts(texts: list[str]) -> list[list[str]]:
    return [texts[i : i + SHARD_CLIPS] for i in range(0, len(texts), SHARD_CLIPS)]


def synthesize_sharded(texts: list[str], seed: int, augment: bool = False, languages: list[str] | None = None) -> Clips:
    """In this process, the same clips that `build_shards(..., texts, seed, ..., augment, languages)` writes."""
    names = _shard_texts(languages or [ENGLISH.name] * len(texts))
    parts = [synthesize_clips(t, shard_seed(seed, k), augment, names[k]) for k, t in enumerate(_shard_texts(texts))]
    return Clips(np.concatenate([p.pcm for p in parts]), np.concatenate([p.lengths for p in parts]), list(texts),
                 [name for p in parts for name in p.languages])


# (shard file, texts, seed, augment, each clip's language)
ShardJob = tuple[Path, list[str], int, bool, list[str]]


def _recipe(augment: bool, languages: list[str]) -> str:
    return f"{RECIPE} {'augmented' if augment else 'plain'} {','.join(sorted(set(languages)))}"


def _write_shard(job: ShardJob) -> Path:
    path, texts, seed, augment, languages = job
    clips = synthesize_clips(texts, seed, augment, languages)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, pcm=clips.pcm, lengths=clips.lengths, texts=np.array(clips.texts),
             languages=np.array(clips.languages), recipe=np.array(_recipe(augment, languages)))
    tmp.rename(path)  # only complete shards carry the final name
    return path


def _complete(job: ShardJob) -> bool:
    path, texts, _, augment, languages = job
    if not path.exists():
        return False
    with np.load(path) as shard:
        recipe = str(shard["recipe"]) if "recipe" in shard.files else None
        return (recipe == _recipe(augment, languages) and [str(t) for t in shard["texts"]] == list(texts)
                and [str(n) for n in shard["languages"]] == list(languages))


def build_shards(out_dir: Path, texts: list[str], seed: int, workers: int, prefix: str = "train",
                 augment: bool = False, languages: list[str] | None = None) -> list[Path]:
    """Synthesize `texts` (each in its language of `languages`; none: English) into shards under `out_dir`
    (shards already holding the same texts and languages, made by the same recipe, are reused)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    names = _shard_texts(languages or [ENGLISH.name] * len(texts))
    jobs: list[ShardJob] = [(out_dir / f"{prefix}-{k:05d}.npz", t, shard_seed(seed, k), augment, names[k])
                            for k, t in enumerate(_shard_texts(texts))]
    todo = [j for j in jobs if not _complete(j)]
    with mp.get_context("fork").Pool(workers) as pool:
        for _ in pool.imap_unordered(_write_shard, todo):
            pass
    return [j[0] for j in jobs]


def load_shards(paths: list[Path]) -> Clips:
    """The shards' clips in order, read into one array (no second copy of the samples is held)."""
    lengths, texts, languages = [np.zeros(0, np.int64)], [], []
    for path in paths:
        with np.load(path) as shard:
            lengths.append(shard["lengths"])
            texts += [str(t) for t in shard["texts"]]
            # an adapter's shards (webbuild.train.adapter_data) are English and name no language
            names = shard["languages"] if "languages" in shard.files else [ENGLISH.name] * len(shard["texts"])
            languages += [str(n) for n in names]
    all_lengths = np.concatenate(lengths).astype(np.int64)
    pcm, pos = np.empty(int(all_lengths.sum()), np.int16), 0
    for path in paths:
        with np.load(path) as shard:
            part = shard["pcm"]
            pcm[pos : pos + len(part)] = part
            pos += len(part)
    return Clips(pcm, all_lengths, texts, languages)

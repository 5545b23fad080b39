"""Parallel synthesis of sentence lists into compact shards (int16 PCM + text), and loading.

A shard is one .npz: `pcm` (all clips' int16 samples concatenated), `lengths`, `texts`.
Each shard has its own seeded RNG, so the data do not depend on the number of workers. A shard
also records how it was made (`recipe`), so shards of an older synthesis are made again, not reused.
"""

from __future__ import annotations

import multiprocessing as mp
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from webbuild.train.speech import random_style, synthesize

SHARD_CLIPS = 500
RECIPE = 2  # bump when synthesis changes; 2: espeak-ng's leading silence trimmed, augmented styles


@dataclass
class Clips:
    pcm: np.ndarray  # int16, all clips concatenated
    lengths: np.ndarray  # int64 samples per clip
    texts: list[str]

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.lengths)[:-1]])

    def clip(self, i: int) -> np.ndarray:
        start = int(self.offsets[i])
        return self.pcm[start : start + int(self.lengths[i])].astype(np.float32) / 32767.0


def synthesize_clips(texts: list[str], seed: int, augment: bool = False) -> Clips:
    """Clips of `texts`; `augment`: the training styles (speech.random_style)."""
    rng = np.random.default_rng(seed)
    pcms = [synthesize(t, random_style(rng, augment), rng) for t in texts]
    pcm16 = np.concatenate([np.round(p * 32767).astype(np.int16) for p in pcms])
    return Clips(pcm16, np.array([len(p) for p in pcms], np.int64), list(texts))


def shard_seed(seed: int, k: int) -> int:
    return seed * 100_003 + k


def _shard_texts(texts: list[str]) -> list[list[str]]:
    return [texts[i : i + SHARD_CLIPS] for i in range(0, len(texts), SHARD_CLIPS)]


def synthesize_sharded(texts: list[str], seed: int, augment: bool = False) -> Clips:
    """In this process, the same clips that `build_shards(..., texts, seed, ..., augment)` writes."""
    parts = [synthesize_clips(t, shard_seed(seed, k), augment) for k, t in enumerate(_shard_texts(texts))]
    return Clips(np.concatenate([p.pcm for p in parts]), np.concatenate([p.lengths for p in parts]), list(texts))


def _recipe(augment: bool) -> str:
    return f"{RECIPE} {'augmented' if augment else 'plain'}"


def _write_shard(job: tuple[Path, list[str], int, bool]) -> Path:
    path, texts, seed, augment = job
    clips = synthesize_clips(texts, seed, augment)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, pcm=clips.pcm, lengths=clips.lengths, texts=np.array(clips.texts),
             recipe=np.array(_recipe(augment)))
    tmp.rename(path)  # only complete shards carry the final name
    return path


def _complete(path: Path, texts: list[str], augment: bool) -> bool:
    if not path.exists():
        return False
    with np.load(path) as shard:
        recipe = str(shard["recipe"]) if "recipe" in shard.files else None
        return recipe == _recipe(augment) and [str(t) for t in shard["texts"]] == list(texts)


def build_shards(out_dir: Path, texts: list[str], seed: int, workers: int, prefix: str = "train",
                 augment: bool = False) -> list[Path]:
    """Synthesize `texts` into shards under `out_dir` (shards already holding the same texts, made by
    the same recipe, are reused)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(out_dir / f"{prefix}-{k:05d}.npz", t, shard_seed(seed, k), augment)
            for k, t in enumerate(_shard_texts(texts))]
    todo = [j for j in jobs if not _complete(*j[:2], augment)]
    with mp.get_context("fork").Pool(workers) as pool:
        for _ in pool.imap_unordered(_write_shard, todo):
            pass
    return [j[0] for j in jobs]


def load_shards(paths: list[Path]) -> Clips:
    """The shards' clips in order, read into one array (no second copy of the samples is held)."""
    lengths, texts = [np.zeros(0, np.int64)], []
    for path in paths:
        with np.load(path) as shard:
            lengths.append(shard["lengths"])
            texts += [str(t) for t in shard["texts"]]
    all_lengths = np.concatenate(lengths).astype(np.int64)
    pcm, pos = np.empty(int(all_lengths.sum()), np.int16), 0
    for path in paths:
        with np.load(path) as shard:
            part = shard["pcm"]
            pcm[pos : pos + len(part)] = part
            pos += len(part)
    return Clips(pcm, all_lengths, texts)

"""An adapter run's clips, synthesized once into a folder of shards over worker processes, then loaded
by every run that trains on them (`python -m webbuild.train.adapt data`, `train --data`, `sweep`).

Four parts, each a list of shards in webbuild.train.dataset's format (int16 PCM, lengths, texts, the
recipe that made them), each shard with its own seed, so the clips do not depend on the number of
workers:
- `target`: the target's training clips, training sentences of seed TRAIN_SEED (never a held-out
  sentence) in the target's style;
- `general`: general training clips in the base's own augmented styles, on the training draws after
  the target's;
- `heldout-target`: the target's held-out clips, exactly `target.heldout_target(target, count)`
  (one shard: its styles come from one random stream);
- `heldout-general`: the general held-out set, exactly `adapt.general_heldout(count)` (the base's
  held-out clips).
"""

from __future__ import annotations

import json
import multiprocessing as mp
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from webbuild.train.dataset import RECIPE, SHARD_CLIPS, Clips, load_shards, shard_seed, synthesize_clips
from webbuild.train.sentences import HELDOUT_SEED, heldout_sentences, load_vocabulary, training_sentences
from webbuild.train.target import TARGET_SEED, TARGETS, TRAIN_SEED, target_clips

GENERAL_SEED = 11  # styles and noise of the general clips mixed into an adapter's training
PLAN = "data.json"


@dataclass(frozen=True)
class Plan:
    target: str
    clips: int  # target training clips
    general: int  # general training clips
    count: int  # held-out clips per evaluation set


@dataclass
class AdapterData:
    plan: Plan
    train: Clips | None  # the target's training clips (the first plan.clips), then the general ones
    sets: dict[str, Clips]  # "{target} held-out", "general held-out"


# (shard file, kind, texts, seed); kind: "plain" / "augmented" (dataset.synthesize_clips) or a target
Job = tuple[Path, str, list[str], int]


def _shards(texts: list[str]) -> list[list[str]]:
    return [texts[i : i + SHARD_CLIPS] for i in range(0, len(texts), SHARD_CLIPS)]


def jobs(folder: Path, plan: Plan) -> dict[str, list[Job]]:
    """Every shard of the plan, by part."""
    vocab = load_vocabulary()
    train = training_sentences(vocab, plan.clips + plan.general, TRAIN_SEED)
    held = heldout_sentences(vocab, plan.count)
    return {
        "target": [(folder / f"target-{k:05d}.npz", plan.target, t, shard_seed(TARGET_SEED + TRAIN_SEED, k))
                   for k, t in enumerate(_shards(train[: plan.clips]))],
        "general": [(folder / f"general-{k:05d}.npz", "augmented", t, shard_seed(GENERAL_SEED, k))
                    for k, t in enumerate(_shards(train[plan.clips :]))],
        "heldout-target": [(folder / "heldout-target.npz", plan.target, held, TARGET_SEED)] if held else [],
        "heldout-general": [(folder / f"heldout-general-{k:05d}.npz", "plain", t, shard_seed(HELDOUT_SEED, k))
                            for k, t in enumerate(_shards(held))],
    }


def synthesize(kind: str, texts: list[str], seed: int) -> Clips:
    if kind in TARGETS:
        return target_clips(kind, texts, seed)
    return synthesize_clips(texts, seed, augment={"plain": False, "augmented": True}[kind])


def _recipe(kind: str, seed: int) -> str:
    return f"{RECIPE} {kind} {seed}"


def _complete(job: Job) -> bool:
    path, kind, texts, seed = job
    if not path.exists():
        return False
    with np.load(path) as shard:
        return str(shard["recipe"]) == _recipe(kind, seed) and [str(t) for t in shard["texts"]] == list(texts)


def _write(job: Job) -> Path:
    path, kind, texts, seed = job
    clips = synthesize(kind, texts, seed)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, pcm=clips.pcm, lengths=clips.lengths, texts=np.array(clips.texts),
             recipe=np.array(_recipe(kind, seed)))
    tmp.rename(path)  # only complete shards carry the final name
    return path


def build(folder: Path, plan: Plan, workers: int = 1) -> Path:
    """Synthesize the plan's clips into `folder` over `workers` processes (shards already made by the
    same recipe are kept) and record the plan."""
    if plan.target not in TARGETS:
        raise ValueError(f"unknown target {plan.target!r}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    todo = [j for part in jobs(folder, plan).values() for j in part if not _complete(j)]
    todo.sort(key=lambda j: -len(j[2]))  # the longest jobs first, so none is left alone at the end
    if workers > 1 and len(todo) > 1:
        with mp.get_context("fork").Pool(min(workers, len(todo))) as pool:
            for _ in pool.imap_unordered(_write, todo):
                pass
    else:
        for job in todo:
            _write(job)
    (folder / PLAN).write_text(json.dumps(asdict(plan), indent=1) + "\n")
    return folder


def read_plan(folder: Path) -> Plan:
    path = Path(folder) / PLAN
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; make the folder with `python -m webbuild.train.adapt data`")
    return Plan(**json.loads(path.read_text()))


def load(folder: Path, training: bool = True) -> AdapterData:
    """The folder's clips (without `training`, the held-out sets alone). The training clips are read
    into one array, target's then general's."""
    plan = read_plan(folder)
    parts = jobs(Path(folder), plan)
    missing = [str(j[0]) for part in parts.values() for j in part if not j[0].exists()]
    if missing:
        raise FileNotFoundError(f"{folder}: shards missing ({', '.join(missing[:3])}); run `adapt data` again")
    paths = {name: [j[0] for j in part] for name, part in parts.items()}
    train = load_shards(paths["target"] + paths["general"]) if training else None
    sets = {f"{plan.target} held-out": load_shards(paths["heldout-target"]),
            "general held-out": load_shards(paths["heldout-general"])}
    return AdapterData(plan, train, sets)

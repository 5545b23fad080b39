"""An adapter run's clips, synthesized once into a folder of shards over worker processes, then loaded
by every run that trains on them (`python -m webbuild.train.adapt data`, `train --data`, `sweep`).

Four parts, each a list of shards in webbuild.train.dataset's format (int16 PCM, lengths, texts, the
recipe that made them), each shard with its own seed, so the clips do not depend on the number of
workers:
- `target`: the target's training clips, training sentences of seed TRAIN_SEED (never a held-out
  sentence) in the target's style;
- `general`: general training clips in the base's own augmented styles, each in one of the base's
  languages (`Plan.languages`, uniform among them as the base trained), drawn apart from the target's;
- `heldout-target`: the target's held-out clips, exactly `target.heldout_target(target, count)`
  (one shard: its styles come from one random stream);
- `heldout-general`: the general held-out set, exactly `adapt.general_heldout(count, languages)` (the base's
  held-out sentences, `count` in all, the languages in turn).
"""

from __future__ import annotations

import json
import multiprocessing as mp
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from webbuild.train.dataset import RECIPE, SHARD_CLIPS, Clips, load_shards, shard_seed, synthesize_clips
from webbuild.train.languages import ENGLISH, Language, parse_languages
from webbuild.train.sentences import (
    HELDOUT_SEED,
    heldout_sentences,
    load_vocabulary,
    mixed_heldout,
    mixed_training,
    training_sentences,
)
from webbuild.train.target import TARGET_SEED, TARGETS, TRAIN_SEED, target_clips

GENERAL_SEED = 11  # styles and noise of the general clips mixed into an adapter's training
PLAN = "data.json"


@dataclass(frozen=True)
class Plan:
    target: str
    clips: int  # target training clips
    general: int  # general training clips
    count: int  # held-out clips per evaluation set
    languages: tuple[str, ...] = (ENGLISH.name,)  # the base's: the general clips' languages


@dataclass
class AdapterData:
    plan: Plan
    train: Clips | None  # the target's training clips (the first plan.clips), then the general ones
    sets: dict[str, Clips]  # "{target} held-out", "general held-out"


# (shard file, kind, texts, seed, each clip's language); kind: "plain" / "augmented" (dataset.synthesize_clips)
# or a target
Job = tuple[Path, str, list[str], int, list[str]]


def _shards(items: list[str]) -> list[list[str]]:
    return [items[i : i + SHARD_CLIPS] for i in range(0, len(items), SHARD_CLIPS)]


def _part(folder: Path, name: str, kind: str, texts: list[str], languages: list[str], seed: int) -> list[Job]:
    """One part's shards: SHARD_CLIPS clips each, shard k seeded by shard_seed(seed, k)."""
    return [(folder / f"{name}-{k:05d}.npz", kind, t, shard_seed(seed, k), n)
            for k, (t, n) in enumerate(zip(_shards(texts), _shards(languages), strict=True))]


def _parsed(languages: tuple[str, ...]) -> tuple[Language, ...]:
    """The plan's language names as languages (a name webbuild.train has no words for: its one-line error)."""
    return parse_languages(",".join(languages))


def general_sentences(languages: tuple[str, ...], count: int) -> tuple[list[str], list[str]]:
    """(sentences, their languages) of the general training clips: each clip's language uniform among the
    base's, as its training drew them, from a stream of their own (GENERAL_SEED)."""
    return mixed_training(_parsed(languages), count, GENERAL_SEED)


def general_heldout_sentences(languages: tuple[str, ...], count: int) -> tuple[list[str], list[str]]:
    """(sentences, their languages) of the general held-out set: the base's held-out sentences, `count` in all
    (at least one a language), the languages in turn."""
    langs = _parsed(languages)
    return mixed_heldout(langs, max(1, count // len(langs))) if count else ([], [])


def jobs(folder: Path, plan: Plan) -> dict[str, list[Job]]:
    """Every shard of the plan, by part. The target speaks English sentences; the general clips the plan's
    languages."""
    train = training_sentences(load_vocabulary(), plan.clips, TRAIN_SEED)
    held = heldout_sentences(load_vocabulary(), plan.count)
    english = [ENGLISH.name] * len(held)
    return {
        "target": _part(folder, "target", plan.target, train, [ENGLISH.name] * len(train), TARGET_SEED + TRAIN_SEED),
        "general": _part(folder, "general", "augmented", *general_sentences(plan.languages, plan.general),
                         GENERAL_SEED),
        # one shard: the target's held-out styles come from one random stream
        "heldout-target": [(folder / "heldout-target.npz", plan.target, held, TARGET_SEED, english)] if held else [],
        "heldout-general": _part(folder, "heldout-general", "plain",
                                 *general_heldout_sentences(plan.languages, plan.count), HELDOUT_SEED),
    }


def synthesize(kind: str, texts: list[str], seed: int, languages: list[str]) -> Clips:
    if kind in TARGETS:
        return target_clips(kind, texts, seed)
    return synthesize_clips(texts, seed, augment={"plain": False, "augmented": True}[kind], languages=languages)


def _recipe(kind: str, seed: int) -> str:
    return f"{RECIPE} {kind} {seed}"


def _complete(job: Job) -> bool:
    path, kind, texts, seed, languages = job
    if not path.exists():
        return False
    with np.load(path) as shard:
        named = [str(n) for n in shard["languages"]] if "languages" in shard.files else None
        return (str(shard["recipe"]) == _recipe(kind, seed) and [str(t) for t in shard["texts"]] == list(texts)
                and named == list(languages))


def _write(job: Job) -> Path:
    path, kind, texts, seed, languages = job
    clips = synthesize(kind, texts, seed, languages)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, pcm=clips.pcm, lengths=clips.lengths, texts=np.array(clips.texts),
             languages=np.array(clips.languages), recipe=np.array(_recipe(kind, seed)))
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
    fields = json.loads(path.read_text())
    return Plan(**fields | {"languages": tuple(fields.get("languages", [ENGLISH.name]))})


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

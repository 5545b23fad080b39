"""The first-word check of issue 17: held-out clips whose speech starts at the first sample (or a few
ms into the speech), and the same clips behind leading silence, with the WER of a model on each set.

    python -m webbuild.train.onset MODEL [--count 200] [--lead-ms MS] [--device cuda] [--write DIR]

MODEL is an ONNX export folder or a built site (onnxruntime CPU, webbuild.reference.transcribe), or
a training checkpoint (torch, batched greedy decoding as in training). `--lead-ms` is the front-end's
leading silence (webbuild.reference.mel) where the model's encoder takes mel or is a checkpoint; a
built site's encoder graph carries its own.

The sets share their speech: each clip is synthesized once with no leading silence (speech from its
first sample, white noise over it all); the other sets cut into it or put 0.3 s of silence in front:
exact zeros (`zeros300ms`), or white noise at the clip's own noise level, measured on its trailing
silence (`noise300ms`: what training clips start with). `heldout` is the training run's own held-out
clips of the same sentences (other voices and noise, 0.05-0.4 s of silence first).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click
import numpy as np

from webbuild.reference.mel import DEFAULT_LEAD_MS, lead_samples
from webbuild.reference.wer import corpus_wer
from webbuild.text import plural
from webbuild.train.dataset import Clips, synthesize_sharded
from webbuild.train.sentences import HELDOUT_SEED, heldout_sentences, load_vocabulary
from webbuild.train.speech import SAMPLE_RATE, random_style, synthesize

ONSET_SEED = 20261130  # voices and noise of the onset clips; the sentences are the held-out draw's
COUNT = 200
CUTS_MS = (0, 5, 10)  # speech from the first sample, then cut that far into it
LEAD_S = 0.3  # silence put in front, as in the measurement
TAIL_S = 0.05  # the end of every clip is trailing silence: noise alone


def onset_speech(count: int = COUNT) -> tuple[list[str], list[np.ndarray]]:
    """The first `count` held-out sentences, each with speech from its first sample."""
    texts = heldout_sentences(load_vocabulary(), count)
    rng = np.random.default_rng(ONSET_SEED)
    pcms = [synthesize(t, dataclasses.replace(random_style(rng), lead_s=0.0), rng) for t in texts]
    return texts, pcms


def onset_sets(count: int = COUNT) -> dict[str, tuple[list[str], list[np.ndarray]]]:
    """Set name -> (texts, clips): `onset+Nms` (cut N ms into the speech), `zeros300ms`, `noise300ms`,
    `heldout`."""
    texts, pcms = onset_speech(count)
    sets = {f"onset+{ms}ms": (texts, [p[ms * SAMPLE_RATE // 1000:] for p in pcms]) for ms in CUTS_MS}
    n, ms = int(LEAD_S * SAMPLE_RATE), int(LEAD_S * 1000)
    sets[f"zeros{ms}ms"] = (texts, [np.concatenate([np.zeros(n, np.float32), p]) for p in pcms])
    rng = np.random.default_rng(ONSET_SEED + 1)
    noisy = []
    for p in pcms:
        level = np.sqrt(np.mean(p[-int(TAIL_S * SAMPLE_RATE):] ** 2))
        noisy.append(np.concatenate([(rng.standard_normal(n) * level).astype(np.float32), p]))
    sets[f"noise{ms}ms"] = (texts, noisy)
    held = synthesize_sharded(texts, HELDOUT_SEED)
    sets["heldout"] = (texts, [held.clip(i) for i in range(len(texts))])
    return sets


def as_clips(texts: list[str], pcms: list[np.ndarray]) -> Clips:
    pcm16 = np.concatenate([np.round(np.clip(p, -1, 1) * 32767).astype(np.int16) for p in pcms])
    return Clips(pcm16, np.array([len(p) for p in pcms], np.int64), list(texts))


def _is_checkpoint(model: Path) -> bool:
    return (model / "config.json").is_file() and any(model.glob("*.safetensors"))


def transcripts(model: Path, pcms: list[np.ndarray], lead_ms: int, device: str) -> list[str]:
    """Greedy transcripts of `pcms` (16 kHz float) by an ONNX model folder, a built site or a checkpoint.
    Checkpoints see the clips through int16, as in training."""
    if _is_checkpoint(model):
        import torch
        from tokenizers import Tokenizer
        from transformers import Qwen3ASRForConditionalGeneration

        from webbuild.train.batches import ClipStore
        from webbuild.train.evaluate import heldout_wer

        tok = Tokenizer.from_file(str(model / "tokenizer.json"))
        net = Qwen3ASRForConditionalGeneration.from_pretrained(model).to(device).eval()
        store = ClipStore.build(as_clips([""] * len(pcms), pcms), tok, device)
        with torch.no_grad():
            return heldout_wer(net, tok, store, lead=lead_samples(lead_ms))[1]
    from webbuild.reference.transcribe import load_transcriber

    runner = load_transcriber(model, lead=lead_samples(lead_ms))
    return [runner.transcribe(p) for p in pcms]


@click.command()
@click.argument("model", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--count", default=COUNT, show_default=True, help="clips per set (the first held-out sentences)")
@click.option("--lead-ms", default=DEFAULT_LEAD_MS, show_default=True,
              help="front-end leading silence, ms (encoders taking mel, and checkpoints)")
@click.option("--device", default="cpu", show_default=True, help="torch device, for a checkpoint")
@click.option("--sets", default=None, help="comma-separated set names (default: all)")
@click.option("--write", "write_dir", type=click.Path(path_type=Path), default=None,
              help="also write each set's clips as WAV + .txt into DIR/<set>/ (for webbuild transcribe / verify)")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None,
              help="write WER and transcripts per set to this file")
def main(model: Path, count: int, lead_ms: int, device: str, sets: str | None, write_dir: Path | None,
         json_path: Path | None):
    """WER of MODEL on clips with speech from the first sample and on the same clips behind silence."""
    all_sets = onset_sets(count)
    names = sets.split(",") if sets else list(all_sets)
    unknown = sorted(set(names) - set(all_sets))
    if unknown:
        raise click.BadParameter(f"unknown set {unknown[0]!r}; the sets are {', '.join(all_sets)}", param_hint="--sets")
    report: dict = {"model": str(model), "count": count, "lead_ms": lead_ms, "sets": {}}
    for name in names:
        texts, pcms = all_sets[name]
        if write_dir:
            _write(write_dir / name, texts, pcms)
        hyps = transcripts(model, pcms, lead_ms, device)
        score = corpus_wer(list(zip(texts, hyps)))
        report["sets"][name] = {"wer": score, "pairs": [[t, h] for t, h in zip(texts, hyps) if t != h]}
        click.echo(f"{name}\tWER {100 * score:.2f}% over {plural(len(texts), 'clip')}")
    if json_path:
        json_path.write_text(json.dumps(report, indent=1) + "\n")


def _write(folder: Path, texts: list[str], pcms: list[np.ndarray]) -> None:
    from webbuild.reference.audio import write_wav

    folder.mkdir(parents=True, exist_ok=True)
    for i, (text, pcm) in enumerate(zip(texts, pcms)):
        write_wav(folder / f"onset-{i:03d}.wav", pcm)
        (folder / f"onset-{i:03d}.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()

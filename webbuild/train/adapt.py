"""Train a LoRA adapter (webbuild.train.lora) for one target (webbuild.train.target) on a frozen base.

    python -m webbuild.train.adapt survey BASE [--count 100]
    python -m webbuild.train.adapt data --target klatt --clips 40000 --general 40000 --out DATA [--workers 16]
        [--languages English,German,French,Spanish,Russian,Greek]
    python -m webbuild.train.adapt train BASE --target klatt --out DIR [--data DATA] [--steps 600 ...]
    python -m webbuild.train.adapt sweep BASE --data DATA --out DIR --run "a=--steps 2500 --lr 5e-4" ...
    python -m webbuild.train.adapt evaluate BASE ADAPTER --target klatt [--count 200]

BASE is a transformers checkpoint folder or a split export such as examples/tiny-asr/model (a folder
with decoder_init.onnx), rebuilt into a temporary checkpoint first (webbuild.train.from_export).

`survey` prints the base's WER on every target's held-out clips (the worst one is worth an adapter).
`data` synthesizes a run's clips once, over worker processes (webbuild.train.adapter_data). The target speaks
English; the general clips (training and held-out) speak the base's `--languages`, so that an adapter on a
multilingual base learns to leave its other languages as they were.
`train` fits the adapter on the target's training clips mixed with general training clips (so the
general held-out WER does not drift), then reports WER with and without it on the target's held-out
clips and on the general held-out set, and writes the folder plus `train_log.json`; without `--data`
it synthesizes its clips first, as `data` does. `sweep` runs `train` for several option sets at once
on one data folder (each in its own process) and writes a markdown WER table of them.

The encoder is frozen and no adapter touches it, so each training clip's audio embeddings are
computed once; a step runs only the text decoder.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from io import TextIOWrapper
from pathlib import Path

import click
import numpy as np
import torch
from tokenizers import Tokenizer

from webbuild.reference.mel import DEFAULT_LEAD_MS, lead_samples
from webbuild.text import plural
from webbuild.train import adapter_data
from webbuild.train.batches import ClipStore, features, token_batch
from webbuild.train.dataset import Clips, synthesize_sharded
from webbuild.train.evaluate import heldout_wer
from webbuild.train.fastpath import encode_audio, logits_and_loss
from webbuild.train.from_export import is_export, rebuild
from webbuild.train.languages import ENGLISH
from webbuild.train.lora import adapted, attach, load_adapter, save_adapter
from webbuild.train.sentences import HELDOUT_SEED
from webbuild.train.target import TARGETS, heldout_target
from webbuild.train.train import LEAD_SHARE, hardware, languages_callback, lr_at

BOUND = 0.01  # issue 18: an adapter may cost at most 1 point of general held-out WER
_REBUILT: dict[Path, Path] = {}


def base_checkpoint(base: Path) -> Path:
    """A checkpoint folder for `base`: itself, or for a split export its rebuild in a temporary
    folder (made once per process, removed at exit)."""
    if not is_export(base):
        return base
    key = Path(base).resolve()
    if key not in _REBUILT:
        tmp = Path(tempfile.mkdtemp(prefix="webbuild-base-"))
        atexit.register(shutil.rmtree, tmp, True)
        _REBUILT[key] = rebuild(base, tmp)
    return _REBUILT[key]


def load_base(base: Path, device: str = "cpu"):
    from transformers import Qwen3ASRForConditionalGeneration
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per load floods the logs of a sweep
    ckpt = base_checkpoint(Path(base))
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    return Qwen3ASRForConditionalGeneration.from_pretrained(ckpt).to(device).eval(), tok


def general_heldout(count: int, languages: tuple[str, ...] = (ENGLISH.name,)) -> Clips:
    """The general held-out set: `count` of the base's held-out sentences in its `languages`, in turn."""
    texts, names = adapter_data.general_heldout_sentences(languages, count)
    return synthesize_sharded(texts, HELDOUT_SEED, languages=names)


@torch.no_grad()
def audio_cache(model, store: ClipStore, lead: int, batch_size: int = 64) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each clip's audio embeddings (LEAD_SHARE of them behind the front-end's lead, as the base
    trained) and its mel frame count."""
    audio, frames = [], []
    for start in range(0, len(store), batch_size):
        idx = torch.arange(start, min(start + batch_size, len(store)), device=store.pcm.device)
        feats, mask = features(store, idx, lead=lead, lead_share=LEAD_SHARE)
        flat, counts = encode_audio(model, feats, mask)
        audio += list(flat.split(counts.tolist()))
        frames.append(mask.sum(1))
    return audio, torch.cat(frames)


def adapter_loss(model, tok, store, cache, idx: torch.Tensor) -> torch.Tensor:
    """Teacher-forced answer cross-entropy of clips `idx` on their cached audio embeddings."""
    audio, frames = cache
    device = frames.device
    mask = (torch.arange(int(frames[idx].max()), device=device)[None, :] < frames[idx][:, None]).long()
    ids, att, labels = (t.to(device) for t in token_batch(store, idx, mask, tok, train=True))
    embeds = torch.cat([audio[i] for i in idx.tolist()])
    return logits_and_loss(model, ids, att, None, None, labels, audio=embeds)[1]


def batch_indices(gen: torch.Generator, n_target: int, n_total: int, batch_size: int,
                  general_share: float | None) -> torch.Tensor:
    """A batch's clips: uniform over all clips, or `general_share` of them general clips (those past
    the first `n_target`) and the rest target clips."""
    if general_share is None:
        return torch.randint(0, n_total, (batch_size,), generator=gen)
    n_general = round(batch_size * general_share)
    return torch.cat([torch.randint(0, n_target, (batch_size - n_general,), generator=gen),
                      torch.randint(n_target, n_total, (n_general,), generator=gen)])


def fit(model, tok, store, cache, steps: int, batch_size: int, lr: float, warmup: int, seed: int,
        n_target: int, general_share: float | None = None, max_minutes: float = 0.0) -> tuple[list[float], int]:
    """AdamW on the adapter's weights only, warmup then cosine over `steps`, or over `max_minutes`
    if that runs out first (the schedule follows whichever is further along, as webbuild.train does);
    the mean loss per 50 steps and the steps run."""
    params = [p for m in adapted(model).values() for p in (m.lora_A.weight, m.lora_B.weight)]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    gen, losses, log = torch.Generator().manual_seed(seed), [], []
    model.train()
    t0, step = time.time(), 0
    for step in range(steps):
        progress = max(step / steps, (time.time() - t0) / (60 * max_minutes) if max_minutes else 0.0)
        if progress >= 1.0:
            print(f"time budget reached at step {step}", flush=True)
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, progress, lr, warmup)
        idx = batch_indices(gen, n_target, len(store), batch_size, general_share)
        loss = adapter_loss(model, tok, store, cache, idx)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
        if (step + 1) % 50 == 0:
            log.append(round(float(np.mean(losses[-50:])), 4))
            print(f"step {step + 1} loss {log[-1]:.4f} {(time.time() - t0) / (step + 1):.3f} s/step", flush=True)
    else:
        step = steps
    model.eval()
    return log, step


def score(model, tok, clips: Clips, lead: int) -> tuple[float, list[str]]:
    store = ClipStore.build(clips, tok, str(next(model.parameters()).device))
    return heldout_wer(model, tok, store, batch_size=50, lead=lead)


def wer_table(model, tok, sets: dict[str, Clips], lead: int) -> dict[str, float]:
    return {name: round(score(model, tok, clips, lead)[0], 5) for name, clips in sets.items()}


def eval_sets(target: str, count: int, languages: tuple[str, ...]) -> dict[str, Clips]:
    return {f"{target} held-out": heldout_target(target, count), "general held-out": general_heldout(count, languages)}


def train_adapter(device: str, base: Path, out_dir: Path, data: adapter_data.AdapterData, *, steps: int = 600,
                  batch_size: int = 32, lr: float = 1e-3, warmup: int = 50, rank: int = 32, alpha: float = 32.0,
                  general_share: float | None = None, max_minutes: float = 0.0, scales: tuple[float, ...] = (),
                  lead_ms: int = DEFAULT_LEAD_MS, seed: int = 1) -> dict:
    """Fit a rank-`rank` adapter on `data`'s training clips over the frozen `base`, write it to
    `out_dir` and measure the base and the adapter read back (fp16, as shipped) at scale 1 and
    `scales` on `data`'s held-out sets; the run's log (also written as `out_dir`/train_log.json)."""
    t0 = time.time()
    random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
    model, tok = load_base(base, device)
    lead, plan = lead_samples(lead_ms), data.plan
    base_wer = wer_table(model, tok, data.sets, lead)
    click.echo(f"base: {base_wer}")
    assert data.train is not None, "adapter_data.load(training=True) reads the training clips"
    store = ClipStore.build(data.train, tok, device)
    data.train = None  # the samples live on the device now
    cache = audio_cache(model, store, lead, batch_size=256 if device.startswith("cuda") else 64)
    # steps read the cache and the answers alone: let the samples go (a slice would keep their storage)
    store = dataclasses.replace(store, pcm=store.pcm.new_empty(0))
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    click.echo(f"audio embeddings of {len(store)} clips, {time.time() - t0:.0f} s")
    attach(model, rank, alpha)
    t_fit = time.time()
    losses, steps_run = fit(model, tok, store, cache, steps, batch_size, lr, warmup, seed, plan.clips,
                            general_share, max_minutes)
    fit_s = time.time() - t_fit
    save_adapter(model, out_dir, target=plan.target)
    del model, cache, store
    scaled = {}
    for scale in (1.0, *[s for s in scales if s != 1.0]):
        fresh, _ = load_base(base, device)  # measured as shipped: read back from the folder, fp16
        load_adapter(fresh, out_dir, scale)
        scaled[f"{scale:g}"] = wer_table(fresh, tok, data.sets, lead)
        click.echo(f"adapter at scale {scale:g}: {scaled[f'{scale:g}']}")
    log = dict(base=str(base), target=plan.target, rank=rank, lora_alpha=alpha, clips=plan.clips,
               general_clips=plan.general, general_languages=list(plan.languages), general_share=general_share,
               steps=steps, steps_run=steps_run,
               max_minutes=max_minutes, batch_size=batch_size, lr=lr, warmup=warmup, lead_ms=lead_ms, seed=seed,
               eval_clips=plan.count, wer_base=base_wer, wer_adapter=scaled["1"],
               wer_scaled={k: v for k, v in scaled.items() if k != "1"}, losses=losses,
               torch=torch.__version__, device=device, hardware=hardware(device), threads=torch.get_num_threads(),
               fit_seconds=round(fit_s, 1), wall_seconds=round(time.time() - t0, 1))
    (out_dir / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    return log


def markdown_table(runs: list[tuple[str, str, dict | None]]) -> str:
    """A WER table of sweep runs (name, train options, train_log.json or None for a failed run):
    the base, then each run at scale 1 and at its other scales."""
    done = [log for _, _, log in runs if log]
    if not done:
        return "no run finished\n"
    base = done[0]["wer_base"]
    target, general = list(base)
    scales = sorted({k for log in done for k in log["wer_scaled"]}, key=float, reverse=True)
    pct = lambda x: f"{100 * x:.2f}%"  # noqa: E731
    head = ["run", "options", "steps", target, general, "general cost"] + [f"scale {s}: {target} / general"
                                                                              for s in scales]
    rows = [["base", "", "", pct(base[target]), pct(base[general]), ""] + [""] * len(scales)]
    for name, options, log in runs:
        if not log:
            rows.append([name, f"`{options}`", "failed"] + [""] * (len(head) - 3))
            continue
        wer = log["wer_adapter"]
        cost = 100 * (wer[general] - log["wer_base"][general])
        steps = f"{log['steps_run']}" + ("" if log["steps_run"] == log["steps"] else f" of {log['steps']}")
        rows.append([name, f"`{options}`", steps, pct(wer[target]), pct(wer[general]),
                     f"{cost:+.2f}" + ("" if cost <= 100 * BOUND else " (over)")]
                    + [f"{pct(log['wer_scaled'][s][target])} / {pct(log['wer_scaled'][s][general])}"
                       if s in log["wer_scaled"] else "" for s in scales])
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    first = done[0]
    note = (f"\n{first['target']} target, {first['clips']} + {first['general_clips']} training clips, "
            f"{first['eval_clips']} held-out clips per set, {first['lead_ms']} ms lead, {first['device']} "
            f"({first['hardware']}); general cost: points of general held-out WER at scale 1 "
            f"(the bound: +{100 * BOUND:g}).\n")
    return "\n".join(lines) + "\n" + note


@click.group()
@click.option("--threads", default=1, show_default=True, help="torch CPU threads")
@click.option("--device", default="cpu", show_default=True, help="torch device of every command (cpu, cuda)")
@click.pass_context
def main(ctx, threads: int, device: str):
    """Train and measure LoRA adapters of the tiny example."""
    torch.set_num_threads(threads)
    ctx.obj = device


BASE = click.Path(exists=True, file_okay=False, path_type=Path)


languages_option = click.option(
    "--languages", default=ENGLISH.name, show_default=True,
    callback=lambda ctx, param, value: tuple(lang.name for lang in languages_callback(ctx, param, value)),
    help="the base's languages, comma-separated, or 'all': the general clips, training and held-out, speak them")


@main.command()
@click.argument("base", type=BASE)
@click.option("--count", default=100, show_default=True, help="held-out clips per target")
@click.option("--lead-ms", default=DEFAULT_LEAD_MS, show_default=True, help="front-end lead in evaluation")
@languages_option
@click.pass_obj
def survey(device: str, base: Path, count: int, lead_ms: int, languages: tuple[str, ...]):
    """The base's WER on each target's held-out clips."""
    model, tok = load_base(base, device)
    for name in ["general"] + list(TARGETS):
        clips = general_heldout(count, languages) if name == "general" else heldout_target(name, count)
        click.echo(f"{name}\tWER {100 * score(model, tok, clips, lead_samples(lead_ms))[0]:.2f}% "
                   f"over {plural(count, 'clip')}")


@main.command()
@click.option("--target", type=click.Choice(list(TARGETS)), required=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="data folder (shards made by the same recipe are kept)")
@click.option("--clips", default=2000, show_default=True, help="target training clips")
@click.option("--general", default=500, show_default=True, help="general training clips mixed in")
@click.option("--count", default=200, show_default=True, help="held-out clips per evaluation set")
@click.option("--workers", default=os.cpu_count(), show_default=True, help="synthesis processes")
@languages_option
def data(target, out_dir, clips, general, count, workers, languages):
    """Synthesize an adapter run's training and held-out clips into a folder."""
    t0 = time.time()
    adapter_data.build(out_dir, adapter_data.Plan(target, clips, general, count, languages), workers)
    click.echo(f"{out_dir}: {plural(clips + general + 2 * count, 'clip')} ({target}: {clips} training, "
               f"general in {', '.join(languages)}: {general} training, {count} + {count} held-out) "
               f"in {time.time() - t0:.0f} s")


@main.command()
@click.argument("base", type=BASE)
@click.option("--target", type=click.Choice(list(TARGETS)), help="required without --data")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True, help="adapter folder")
@click.option("--data", "data_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="clips made by `data` (then --target, --clips, --general and --count come from it)")
@click.option("--clips", default=2000, show_default=True, help="target training clips")
@click.option("--general", default=500, show_default=True, help="general training clips mixed in")
@click.option("--general-share", type=float, default=None,
              help="general clips' share of each batch (default: uniform over all clips)")
@click.option("--steps", default=600, show_default=True)
@click.option("--max-minutes", default=0.0, show_default=True,
              help="training time budget: the schedule follows whichever of steps or time runs out first; 0 = off")
@click.option("--batch-size", default=32, show_default=True)
@click.option("--lr", default=1e-3, show_default=True)
@click.option("--warmup", default=50, show_default=True)
@click.option("--rank", default=32, show_default=True)
@click.option("--alpha", default=32.0, show_default=True, help="lora_alpha; the update is scaled by alpha / rank")
@click.option("--count", default=200, show_default=True, help="held-out clips per evaluation set")
@click.option("--scales", default="", help="other adapter scales to measure, e.g. 0.75,0.5")
@click.option("--lead-ms", default=DEFAULT_LEAD_MS, show_default=True, help="front-end lead (training and evaluation)")
@click.option("--seed", default=1, show_default=True)
@click.option("--workers", default=1, show_default=True, help="synthesis processes (without --data)")
@languages_option
@click.pass_obj
def train(device, base, target, out_dir, data_dir, clips, general, general_share, steps, max_minutes, batch_size, lr,
          warmup, rank, alpha, count, scales, lead_ms, seed, workers, languages):
    """Fit a rank-RANK adapter for TARGET on the frozen BASE and measure it."""
    if data_dir is None and target is None:
        raise click.UsageError("give --target (or --data)")
    if data_dir is not None and target not in (None, adapter_data.read_plan(data_dir).target):
        raise click.UsageError(f"{data_dir} holds {adapter_data.read_plan(data_dir).target} clips, not {target}")
    if general_share is not None and not 0.0 <= general_share <= 1.0:
        raise click.UsageError("--general-share is a share: 0 to 1")
    with tempfile.TemporaryDirectory(prefix="adapter-data-") as tmp:
        if data_dir is None:
            t0 = time.time()
            data_dir = adapter_data.build(Path(tmp), adapter_data.Plan(target, clips, general, count, languages),
                                          workers)
            click.echo(f"data: {plural(clips + general + 2 * count, 'clip')}, {time.time() - t0:.0f} s")
        loaded = adapter_data.load(data_dir)
    train_adapter(device, base, out_dir, loaded, steps=steps, batch_size=batch_size, lr=lr, warmup=warmup, rank=rank,
                  alpha=alpha, general_share=general_share, max_minutes=max_minutes,
                  scales=tuple(float(s) for s in scales.split(",") if s), lead_ms=lead_ms, seed=seed)


@main.command()
@click.argument("base", type=BASE)
@click.option("--data", "data_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="clips made by `data`")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="a folder per run (adapter + train_log.json), NAME.log per run, wer.md")
@click.option("--run", "runs", multiple=True, required=True,
              help='NAME=TRAIN OPTIONS, e.g. "a=--steps 2500 --lr 5e-4 --general-share 0.5" (repeat)')
@click.option("--jobs", default=0, show_default=True, help="runs at once (0: all)")
@click.option("--scales", default="", help="other adapter scales every run measures, e.g. 0.75,0.5")
@click.pass_obj
def sweep(device, base, data_dir, out_dir, runs, jobs, scales):
    """Run `train` once per --run on the clips of --data, in parallel processes, and tabulate them."""
    specs = []
    for run in runs:
        name, sep, options = run.partition("=")
        if not sep or not name or not name.replace("-", "").replace("_", "").isalnum():
            raise click.UsageError(f"--run {run!r}: want NAME=OPTIONS with a plain NAME")
        specs.append((name, options.strip()))
    if len({n for n, _ in specs}) != len(specs):
        raise click.UsageError("--run names must differ")
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = list(specs)
    running: dict[str, tuple[subprocess.Popen, TextIOWrapper]] = {}
    finished: dict[str, dict | None] = {}

    def command(name, options):
        return [sys.executable, "-m", "webbuild.train.adapt", "--device", device, "--threads",
                str(torch.get_num_threads()), "train", str(base), "--data", str(data_dir), "--out",
                str(out_dir / name), "--scales", scales, *shlex.split(options)]

    def write_table():
        table = markdown_table([(n, o, finished.get(n)) for n, o in specs if n in finished])
        (out_dir / "wer.md").write_text(table)
        return table

    try:
        while todo or running:
            while todo and (not jobs or len(running) < jobs):
                name, options = todo.pop(0)
                log = open(out_dir / f"{name}.log", "w")  # noqa: SIM115 - closed when the run ends
                running[name] = (subprocess.Popen(command(name, options), stdout=log, stderr=subprocess.STDOUT), log)
                click.echo(f"{name}: started ({options})")
            time.sleep(1.0)
            for name, (proc, log) in list(running.items()):
                if proc.poll() is None:
                    continue
                log.close()
                del running[name]
                path = out_dir / name / "train_log.json"
                finished[name] = json.loads(path.read_text()) if proc.returncode == 0 and path.is_file() else None
                state = "done" if finished[name] else f"failed (exit {proc.returncode}), see {name}.log"
                click.echo(f"{name}: {state}")
                write_table()
    finally:
        for proc, log in running.values():
            proc.terminate()
            log.close()
    click.echo(write_table())
    if not all(finished.values()):
        raise click.ClickException("a run failed; its NAME.log says why")


@main.command()
@click.argument("base", type=BASE)
@click.argument("adapter", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--target", type=click.Choice(list(TARGETS)), required=True)
@click.option("--count", default=200, show_default=True, help="held-out clips per evaluation set")
@click.option("--lead-ms", default=DEFAULT_LEAD_MS, show_default=True, help="front-end lead in evaluation")
@click.option("--scale", default=1.0, show_default=True, help="the adapter's update times this (model.yaml scale)")
@languages_option
@click.pass_obj
def evaluate(device, base, adapter, target, count, lead_ms, scale, languages):
    """WER of BASE without and with ADAPTER on TARGET's held-out clips and the general held-out set."""
    model, tok = load_base(base, device)
    sets, lead = eval_sets(target, count, languages), lead_samples(lead_ms)
    base_wer = wer_table(model, tok, sets, lead)
    load_adapter(model, adapter, scale)
    adapter_wer = wer_table(model, tok, sets, lead)
    click.echo(f"| set | base | base + adapter (scale {scale:g}) |\n| --- | --- | --- |")
    for name in sets:
        click.echo(f"| {name} | {100 * base_wer[name]:.2f}% | {100 * adapter_wer[name]:.2f}% |")


if __name__ == "__main__":
    main()

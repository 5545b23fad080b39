"""Train a LoRA adapter (webbuild.train.lora) for one target (webbuild.train.target) on a frozen base.

    python -m webbuild.train.adapt survey CKPT [--count 100]
    python -m webbuild.train.adapt train CKPT --target whisper --out DIR [--steps 600 ...]
    python -m webbuild.train.adapt evaluate CKPT ADAPTER --target whisper [--count 200]

`survey` prints the base's WER on every target's held-out clips (the worst one is worth an adapter).
`train` fits the adapter on the target's training clips mixed with general training clips (so the
general held-out WER does not drift), then reports WER with and without it on the target's held-out
clips and on the general held-out set, and writes the folder plus `train_log.json`.

The encoder is frozen and no adapter touches it, so each training clip's audio embeddings are
computed once; a step runs only the text decoder.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import click
import numpy as np
import torch
from tokenizers import Tokenizer

from webbuild.reference.mel import DEFAULT_LEAD_MS, lead_samples
from webbuild.text import plural
from webbuild.train.batches import ClipStore, features, token_batch
from webbuild.train.dataset import Clips, synthesize_clips, synthesize_sharded
from webbuild.train.evaluate import heldout_wer
from webbuild.train.fastpath import encode_audio, logits_and_loss
from webbuild.train.lora import adapted, attach, load_adapter, save_adapter
from webbuild.train.sentences import HELDOUT_SEED, heldout_sentences, load_vocabulary, training_sentences
from webbuild.train.target import TARGETS, TRAIN_SEED, heldout_target, training_target
from webbuild.train.train import LEAD_SHARE, lr_at

GENERAL_SEED = 11  # styles and noise of the general clips mixed into an adapter's training


def load_base(ckpt: Path, device: str = "cpu"):
    from transformers import Qwen3ASRForConditionalGeneration

    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    return Qwen3ASRForConditionalGeneration.from_pretrained(ckpt).to(device).eval(), tok


def general_heldout(count: int) -> Clips:
    """The general held-out set: the first `count` clips the base's training evaluated on."""
    return synthesize_sharded(heldout_sentences(load_vocabulary(), count), HELDOUT_SEED)


def general_training(count: int, skip: int) -> Clips:
    """`count` base-style (augmented) training clips, on training draws past the target's first `skip`."""
    texts = training_sentences(load_vocabulary(), skip + count, TRAIN_SEED)[skip:]
    return synthesize_clips(texts, GENERAL_SEED, augment=True)


def join(a: Clips, b: Clips) -> Clips:
    return Clips(np.concatenate([a.pcm, b.pcm]), np.concatenate([a.lengths, b.lengths]), a.texts + b.texts)


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


def fit(model, tok, store, cache, steps: int, batch_size: int, lr: float, warmup: int, seed: int) -> list[float]:
    """AdamW on the adapter's weights only, warmup then cosine; the mean loss per 50 steps."""
    params = [p for m in adapted(model).values() for p in (m.lora_A.weight, m.lora_B.weight)]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    gen, losses, log = torch.Generator().manual_seed(seed), [], []
    model.train()
    t0 = time.time()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, step / steps, lr, warmup)
        loss = adapter_loss(model, tok, store, cache, torch.randint(0, len(store), (batch_size,), generator=gen))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
        if (step + 1) % 50 == 0:
            log.append(round(float(np.mean(losses[-50:])), 4))
            print(f"step {step + 1} loss {log[-1]:.4f} {(time.time() - t0) / (step + 1):.2f} s/step", flush=True)
    model.eval()
    return log


def score(model, tok, clips: Clips, lead: int) -> tuple[float, list[str]]:
    store = ClipStore.build(clips, tok, str(next(model.parameters()).device))
    return heldout_wer(model, tok, store, batch_size=50, lead=lead)


def wer_table(model, tok, sets: dict[str, Clips], lead: int) -> dict[str, float]:
    return {name: round(score(model, tok, clips, lead)[0], 5) for name, clips in sets.items()}


def eval_sets(target: str, count: int) -> dict[str, Clips]:
    return {f"{target} held-out": heldout_target(target, count), "general held-out": general_heldout(count)}


@click.group()
@click.option("--threads", default=1, show_default=True, help="torch CPU threads")
@click.option("--device", default="cpu", show_default=True, help="torch device of every command (cpu, cuda)")
@click.pass_context
def main(ctx, threads: int, device: str):
    """Train and measure LoRA adapters of the tiny example."""
    torch.set_num_threads(threads)
    ctx.obj = device


@main.command()
@click.argument("ckpt", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--count", default=100, show_default=True, help="held-out clips per target")
@click.option("--lead-ms", default=DEFAULT_LEAD_MS, show_default=True, help="front-end lead in evaluation")
@click.pass_obj
def survey(device: str, ckpt: Path, count: int, lead_ms: int):
    """The base's WER on each target's held-out clips."""
    model, tok = load_base(ckpt, device)
    for name in ["general"] + list(TARGETS):
        clips = general_heldout(count) if name == "general" else heldout_target(name, count)
        click.echo(f"{name}\tWER {100 * score(model, tok, clips, lead_samples(lead_ms))[0]:.2f}% "
                   f"over {plural(count, 'clip')}")


@main.command()
@click.argument("ckpt", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--target", type=click.Choice(list(TARGETS)), required=True)
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True, help="adapter folder")
@click.option("--clips", default=2000, show_default=True, help="target training clips")
@click.option("--general", default=500, show_default=True, help="general training clips mixed in")
@click.option("--steps", default=600, show_default=True)
@click.option("--batch-size", default=32, show_default=True)
@click.option("--lr", default=1e-3, show_default=True)
@click.option("--warmup", default=50, show_default=True)
@click.option("--rank", default=32, show_default=True)
@click.option("--alpha", default=32.0, show_default=True, help="lora_alpha; the update is scaled by alpha / rank")
@click.option("--count", default=200, show_default=True, help="held-out clips per evaluation set")
@click.option("--lead-ms", default=DEFAULT_LEAD_MS, show_default=True, help="front-end lead (training and evaluation)")
@click.option("--seed", default=1, show_default=True)
@click.pass_obj
def train(device, ckpt, target, out_dir, clips, general, steps, batch_size, lr, warmup, rank, alpha, count, lead_ms,
          seed):
    """Fit a rank-RANK adapter for TARGET on the frozen CKPT and measure it."""
    t0 = time.time()
    random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
    model, tok = load_base(ckpt, device)
    lead = lead_samples(lead_ms)
    sets = eval_sets(target, count)
    base_wer = wer_table(model, tok, sets, lead)
    click.echo(f"base: {base_wer}")
    store = ClipStore.build(join(training_target(target, clips), general_training(general, clips)), tok, device)
    cache = audio_cache(model, store, lead)
    click.echo(f"data: {len(store)} clips, {time.time() - t0:.0f} s")
    attach(model, rank, alpha)
    losses = fit(model, tok, store, cache, steps, batch_size, lr, warmup, seed)
    save_adapter(model, out_dir, target=target)
    fresh, _ = load_base(ckpt, device)  # measured as shipped: read back from the folder, fp16
    load_adapter(fresh, out_dir)
    adapter_wer = wer_table(fresh, tok, sets, lead)
    click.echo(f"adapter: {adapter_wer}")
    log = dict(base=str(ckpt), target=target, rank=rank, lora_alpha=alpha, clips=clips, general_clips=general,
               steps=steps, batch_size=batch_size, lr=lr, warmup=warmup, lead_ms=lead_ms, seed=seed,
               eval_clips=count, wer_base=base_wer, wer_adapter=adapter_wer, losses=losses,
               torch=torch.__version__, threads=torch.get_num_threads(), wall_seconds=round(time.time() - t0, 1))
    (out_dir / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")


@main.command()
@click.argument("ckpt", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("adapter", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--target", type=click.Choice(list(TARGETS)), required=True)
@click.option("--count", default=200, show_default=True, help="held-out clips per evaluation set")
@click.option("--lead-ms", default=DEFAULT_LEAD_MS, show_default=True, help="front-end lead in evaluation")
@click.option("--scale", default=1.0, show_default=True, help="the adapter's update times this (model.yaml scale)")
@click.pass_obj
def evaluate(device, ckpt, adapter, target, count, lead_ms, scale):
    """WER of CKPT without and with ADAPTER on TARGET's held-out clips and the general held-out set."""
    model, tok = load_base(ckpt, device)
    sets, lead = eval_sets(target, count), lead_samples(lead_ms)
    base_wer = wer_table(model, tok, sets, lead)
    load_adapter(model, adapter, scale)
    adapter_wer = wer_table(model, tok, sets, lead)
    click.echo(f"| set | base | base + adapter (scale {scale:g}) |\n| --- | --- | --- |")
    for name in sets:
        click.echo(f"| {name} | {100 * base_wer[name]:.2f}% | {100 * adapter_wer[name]:.2f}% |")


if __name__ == "__main__":
    main()

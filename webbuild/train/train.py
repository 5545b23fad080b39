"""Train the tiny Qwen3-ASR from scratch on espeak-ng speech.

python -m webbuild.train --out DIR [--steps N --batch-size B --clips N --seed S --device cuda]
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import time
from pathlib import Path

import click
import numpy as np
import torch
from tokenizers import Tokenizer

from webbuild.reference.mel import DEFAULT_LEAD_MS, lead_samples
from webbuild.reference.tokenizer import build_tokenizer, special_ids
from webbuild.train.batches import ClipStore, features, token_batch
from webbuild.train.dataset import build_shards, load_shards
from webbuild.train.evaluate import heldout_wer
from webbuild.train.fastpath import ctc_loss, encode_audio, logits_and_loss
from webbuild.train.sentences import HELDOUT_SEED, heldout_sentences, load_vocabulary, training_sentences
from webbuild.train.speech import DIGITAL_SILENCE_SHARE, ONSET_SHARE
from webbuild.zoo.presets import get_preset, make_config

TOKENIZER_SENTENCES = 20000
TOKENIZER_SEED = 0  # the tokenizer does not depend on the run's seed or clip count
PROMPT_WORDS = ["system", "user", "assistant", "language English"]
# training clips seen behind the front-end's leading silence; the others behind none, so the model
# serves a build with model.yaml encoder.lead_ms at its default or at 0
LEAD_SHARE = 0.5


def make_tokenizer(vocab: list[str], bpe_vocab_size: int):
    texts = training_sentences(vocab, TOKENIZER_SENTENCES, TOKENIZER_SEED) + PROMPT_WORDS * 1000
    return build_tokenizer(texts, bpe_vocab_size=bpe_vocab_size)


def make_model(tok):
    from transformers import Qwen3ASRForConditionalGeneration

    config = make_config(get_preset("tiny"), tok.get_vocab_size(), special_ids(tok))
    return Qwen3ASRForConditionalGeneration(config)


def load_model(path: Path):
    from transformers import Qwen3ASRForConditionalGeneration

    return Qwen3ASRForConditionalGeneration.from_pretrained(path)


def lr_at(step: int, progress: float, peak: float, warmup: int) -> float:
    """Linear warmup over `warmup` steps, then cosine to 5% of `peak` as `progress` goes 0 -> 1."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def hardware(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU x{os.cpu_count()}"


def train_step(model, opt, tok, store, idx, device, lr, ctc_weight, lead):
    for group in opt.param_groups:
        group["lr"] = lr
    feats, mask = features(store, idx, random_pad=True, lead=lead, lead_share=LEAD_SHARE)
    ids, att, labels = token_batch(store, idx, mask, tok, train=True)
    with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=device.startswith("cuda")):
        audio, counts = encode_audio(model, feats, mask)
        _, ce = logits_and_loss(model, ids.to(device), att.to(device), feats, mask, labels.to(device), audio=audio)
        ctc = ctc_loss(model, audio, counts, [store.words[i] for i in idx.tolist()], tok.token_to_id("<|endoftext|>"))
    opt.zero_grad(set_to_none=True)
    (ce + ctc_weight * ctc).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return torch.stack([ce.detach(), ctc.detach()])


@click.command()
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True, help="checkpoint folder")
@click.option("--steps", default=4000, show_default=True)
@click.option("--batch-size", default=128, show_default=True)
@click.option("--clips", default=50000, show_default=True, help="training clips to synthesize")
@click.option("--seed", default=1, show_default=True)
@click.option("--device", default="cuda" if torch.cuda.is_available() else "cpu", show_default=True)
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path("/tmp/webbuild-speech"),
              show_default=True, help="synthesized shards (outside the repo; reused when present)")
@click.option("--workers", default=os.cpu_count(), show_default=True)
@click.option("--lr", default=2e-3, show_default=True)
@click.option("--warmup", default=300, show_default=True)
@click.option("--ctc-weight", default=0.5, show_default=True, help="auxiliary CTC loss on the audio embeddings")
@click.option("--heldout", default=500, show_default=True, help="held-out clips for the final WER")
@click.option("--eval-every", default=1000, show_default=True)
@click.option("--max-minutes", default=0.0,
              help="training time budget: the schedule follows whichever of steps or time runs out first; 0 = off")
@click.option("--init", "init_dir", type=click.Path(path_type=Path), default=None,
              help="continue from this checkpoint (its model and tokenizer) instead of starting from scratch")
@click.option("--shard-size", default="10MB", show_default=True, help="max_shard_size for save_pretrained")
@click.option("--lead-ms", default=DEFAULT_LEAD_MS, show_default=True,
              help="the mel front-end's leading silence (model.yaml encoder.lead_ms), on half the training clips "
                   "and in every evaluation")
def main(out_dir, steps, batch_size, clips, seed, device, data_dir, workers, lr, warmup, ctc_weight, heldout,
         eval_every, max_minutes, init_dir, shard_size, lead_ms):
    t0 = time.time()
    random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    preset = get_preset("tiny")
    vocab = load_vocabulary()
    if init_dir:
        tok = Tokenizer.from_file(str(init_dir / "tokenizer.json"))
    else:
        tok = make_tokenizer(vocab, preset.bpe_vocab_size)

    texts = training_sentences(vocab, clips, seed)
    train_paths = build_shards(data_dir / f"seed{seed}", texts, seed, workers, augment=True)
    held_paths = build_shards(data_dir / "heldout", heldout_sentences(vocab, heldout), HELDOUT_SEED, workers,
                              prefix="heldout")
    store = ClipStore.build(load_shards(train_paths), tok, device)
    held = ClipStore.build(load_shards(held_paths), tok, device)
    synth_s = time.time() - t0
    print(f"data: {len(store)} train clips, {len(held)} held-out, {store.pcm.numel() / 16000 / 3600:.1f} h, "
          f"{synth_s:.0f} s", flush=True)

    model = (load_model(init_dir) if init_dir else make_model(tok)).to(device)
    print(f"params: {sum(p.numel() for p in model.parameters()):,}", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01,
                            fused=device.startswith("cuda"))
    gen = torch.Generator(device=device).manual_seed(seed)
    lead = lead_samples(lead_ms)
    t_train, losses, evals, step = time.time(), [], [], 0
    for step in range(steps):
        # progress by steps or by time, whichever is further, so the cosine always completes
        progress = max(step / steps, (time.time() - t_train) / (60 * max_minutes) if max_minutes else 0.0)
        if progress >= 1.0:
            print(f"time budget reached at step {step}", flush=True)
            break
        rate = lr_at(step, progress, lr, warmup)
        idx = torch.randint(0, len(store), (batch_size,), device=device, generator=gen)
        losses.append(train_step(model, opt, tok, store, idx, device, rate, ctc_weight, lead))
        if (step + 1) % 100 == 0:
            ce, ctc = torch.stack(losses[-100:]).mean(0).tolist()
            print(f"step {step + 1} loss {ce:.4f} ctc {ctc:.4f} lr {rate:.2e} "
                  f"{(time.time() - t_train) / (step + 1) * 1000:.0f} ms/step", flush=True)
        if eval_every and (step + 1) % eval_every == 0:
            evals.append((step + 1, heldout_wer(model, tok, held.head(200), lead=lead)[0]))
            print(f"step {step + 1} held-out WER (200 clips) {evals[-1][1]:.4f}", flush=True)
    else:
        step += 1
    train_s = time.time() - t_train
    final_wer, hyps = heldout_wer(model, tok, held, lead=lead)
    print(f"final held-out WER ({len(held)} clips) {final_wer:.4f}", flush=True)
    for ref, hyp in list(zip(held.texts, hyps))[:5]:
        print(f"  ref: {ref}\n  hyp: {hyp}")

    out_dir.mkdir(parents=True, exist_ok=True)
    model.to("cpu").float().save_pretrained(out_dir, max_shard_size=shard_size)
    tok.save(str(out_dir / "tokenizer.json"))
    log = dict(init=str(init_dir) if init_dir else None, seed=seed, steps=step, planned_steps=steps,
               batch_size=batch_size, clips=len(store), heldout_clips=len(held), lr=lr, warmup=warmup,
               lead_ms=lead_ms, lead_share=LEAD_SHARE, onset_share=ONSET_SHARE,
               digital_silence_share=DIGITAL_SILENCE_SHARE,
               hardware=hardware(device), device=device,
               torch=torch.__version__, synth_seconds=round(synth_s, 1), train_seconds=round(train_s, 1),
               wall_seconds=round(time.time() - t0, 1),
               final_loss=round(torch.stack(losses[-100:]).mean(0)[0].item(), 5),
               final_ctc_loss=round(torch.stack(losses[-100:]).mean(0)[1].item(), 5), ctc_weight=ctc_weight,
               heldout_wer=round(final_wer, 5), evals=evals,
               errors=[dict(ref=r, hyp=h) for r, h in zip(held.texts, hyps) if r != h][:50])
    (out_dir / "train_log.json").write_text(json.dumps(log, indent=1))
    print(json.dumps({k: v for k, v in log.items() if k != "errors"}), flush=True)

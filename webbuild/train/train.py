"""Train the tiny Qwen3-ASR from scratch on espeak-ng speech.

python -m webbuild.train --out DIR [--steps N --batch-size B --clips N --seed S --device cuda]
                         [--languages English,German,French,Spanish,Russian,Greek]

`--languages` (default English, the shipped example's one; `all`: every language of
webbuild.train.languages) picks each training clip's language uniformly among them; the held-out set
holds `--heldout` clips of each, and every evaluation prints a row per language.
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import time
from dataclasses import asdict
from pathlib import Path

import click
import numpy as np
import torch
from tokenizers import Tokenizer

from webbuild.reference.mel import DEFAULT_LEAD_MS, lead_samples
from webbuild.reference.tokenizer import build_tokenizer, special_ids
from webbuild.train.batches import ClipStore, features, token_batch
from webbuild.train.dataset import build_shards, load_shards
from webbuild.train.evaluate import LanguageRow, format_names, format_rows, heldout_report, names_report, wer
from webbuild.train.fastpath import ctc_loss, encode_audio, logits_and_loss
from webbuild.train.languages import ENGLISH, Language, parse_languages
from webbuild.train.names import NAMES_HELDOUT, contexts, with_names
from webbuild.train.names import names_heldout as names_set
from webbuild.train.sentences import HELDOUT_SEED, mixed_heldout, mixed_training, tokenizer_size, tokenizer_texts
from webbuild.train.speech import DIGITAL_SILENCE_SHARE, ONSET_SHARE
from webbuild.zoo.presets import get_preset, make_config

EVAL_CLIPS = 100  # per language, in the periodic evaluations (the final one takes all held-out clips)
# training clips seen behind the front-end's leading silence; the others behind none, so the model
# serves a build with model.yaml encoder.lead_ms at its default or at 0
LEAD_SHARE = 0.5


def make_tokenizer(languages: tuple[Language, ...], bpe_vocab_size: int):
    return build_tokenizer(tokenizer_texts(languages), bpe_vocab_size=bpe_vocab_size)


def make_model(tok):
    from transformers import Qwen3ASRForConditionalGeneration

    config = make_config(get_preset("tiny"), tok.get_vocab_size(), special_ids(tok))
    return Qwen3ASRForConditionalGeneration(config)


def load_model(path: Path):
    from transformers import Qwen3ASRForConditionalGeneration

    return Qwen3ASRForConditionalGeneration.from_pretrained(path)


VOCABULARY_WEIGHTS = ("embed_tokens.weight", "lm_head.weight")  # a row per token id


def warm_start(model, path: Path, tok: Tokenizer | None = None) -> list[str]:
    """Copy into `model` every weight of the checkpoint at `path` with the same name and shape.

    The audio encoder and the decoder's layers carry over from a model trained on another vocabulary
    (the English example into a multilingual one); the embedding and lm_head, sized by the vocabulary,
    start fresh, and so do they when `tok` gives the same number of tokens other ids than the checkpoint's
    tokenizer. Returns the names left as initialised; raises when nothing matched (not this family)."""
    try:
        source = load_model(path).state_dict()
    except (OSError, ValueError) as exc:  # transformers' words for a folder that holds no checkpoint
        raise click.UsageError(f"--warm-start {path}: not a checkpoint folder ({str(exc).splitlines()[0]}); a split "
                               "export becomes one with python -m webbuild.train.from_export EXPORT OUT") from None
    target = model.state_dict()
    same_ids = tok is None or _token_ids(path) == tok.get_vocab()
    taken = {name: tensor for name, tensor in source.items()
             if name in target and target[name].shape == tensor.shape
             and (same_ids or not name.endswith(VOCABULARY_WEIGHTS))}
    if not taken:
        raise click.UsageError(f"--warm-start {path}: no weight of that checkpoint fits this model")
    model.load_state_dict(taken, strict=False)
    return sorted(set(target) - set(taken))


def _token_ids(path: Path) -> dict[str, int] | None:
    """The checkpoint's token ids (its tokenizer.json), or None where it has none."""
    file = path / "tokenizer.json"
    return Tokenizer.from_file(str(file)).get_vocab() if file.is_file() else None


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


def languages_callback(ctx, param, value: str) -> tuple[Language, ...]:
    """A click callback: --languages parsed (webbuild.train.languages.parse_languages), its error click's."""
    try:
        return parse_languages(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def log_rows(rows: list[LanguageRow]) -> list[dict]:
    return [dict(language=r.language, clips=r.clips, metric=r.metric, error_rate=round(r.error_rate, 5),
                 language_right=round(r.language_right, 5)) for r in rows]


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
@click.option("--heldout", default=500, show_default=True, help="held-out clips per language, for the final evaluation")
@click.option("--eval-every", default=1000, show_default=True)
@click.option("--max-minutes", default=0.0,
              help="training time budget: the schedule follows whichever of steps or time runs out first; 0 = off")
@click.option("--init", "init_dir", type=click.Path(path_type=Path), default=None,
              help="continue from this checkpoint (its model and tokenizer) instead of starting from scratch")
@click.option("--warm-start", "warm_dir", type=click.Path(path_type=Path, exists=True, file_okay=False),
              default=None, help="a checkpoint whose weights of the same name and shape start this model (the "
                                 "English example's encoder and layers for a multilingual run); not with --init")
@click.option("--shard-size", default="10MB", show_default=True, help="max_shard_size for save_pretrained")
@click.option("--lead-ms", default=DEFAULT_LEAD_MS, show_default=True,
              help="the mel front-end's leading silence (model.yaml encoder.lead_ms), on half the training clips "
                   "and in every evaluation")
@click.option("--languages", "languages", default=ENGLISH.name, show_default=True, callback=languages_callback,
              help="comma-separated languages of the training and held-out clips (Qwen3-ASR's names), or 'all'")
@click.option("--log-every", default=100, show_default=True,
              help="steps between loss lines (each the mean since the last)")
@click.option("--name-share", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="share of training clips with a rare name in their sentence, given in their context text "
                   "(webbuild.train.names): a model that reads its context; > 0 also scores the held-out names set")
@click.option("--names-heldout", type=click.IntRange(min=1), default=NAMES_HELDOUT, show_default=True,
              help="clips per language in the held-out names set (with --name-share)")
@click.option("--data-only", is_flag=True,
              help="synthesize the shards and stop (a later run with the same data options reuses them)")
def main(out_dir, steps, batch_size, clips, seed, device, data_dir, workers, lr, warmup, ctc_weight, heldout,
         eval_every, max_minutes, init_dir, warm_dir, shard_size, lead_ms, languages, log_every, name_share,
         names_heldout, data_only):
    if init_dir and warm_dir:  # before minutes of synthesis
        raise click.UsageError("--init continues a checkpoint, --warm-start starts a new one: give one of them")
    t0 = time.time()
    random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    texts, names = mixed_training(languages, clips, seed)
    texts = with_names(texts, names, name_share, seed)
    train_paths = build_shards(data_dir / f"seed{seed}", texts, seed, workers, augment=True, languages=names)
    held_texts, held_names = mixed_heldout(languages, heldout)
    held_paths = build_shards(data_dir / "heldout", held_texts, HELDOUT_SEED, workers, prefix="heldout",
                              languages=held_names)
    name_texts, name_languages = names_set(languages, names_heldout) if name_share > 0 else ([], [])
    name_paths = build_shards(data_dir / "names", name_texts, HELDOUT_SEED, workers, prefix="names",
                              languages=name_languages) if name_texts else []
    if data_only:
        print(f"data: {len(texts)} train clips, {len(held_texts)} held-out, {time.time() - t0:.0f} s", flush=True)
        return
    preset = get_preset("tiny")
    if init_dir:
        tok = Tokenizer.from_file(str(init_dir / "tokenizer.json"))
    else:
        tok = make_tokenizer(languages, tokenizer_size(languages, preset.bpe_vocab_size))
    store = ClipStore.build(load_shards(train_paths), tok, device, contexts(texts, names, seed))
    held = ClipStore.build(load_shards(held_paths), tok, device)
    named = ClipStore.build(load_shards(name_paths), tok, device,
                            contexts(name_texts, name_languages, HELDOUT_SEED)) if name_paths else None
    synth_s = time.time() - t0
    print(f"data: {len(store)} train clips, {len(held)} held-out ({', '.join(lang.name for lang in languages)}), "
          f"{store.pcm.numel() / 16000 / 3600:.1f} h, {synth_s:.0f} s", flush=True)

    model = load_model(init_dir) if init_dir else make_model(tok)
    if warm_dir:
        fresh = warm_start(model, warm_dir, tok)
        print(f"warm start from {warm_dir}: {len(fresh)} tensors fresh ({', '.join(fresh[:4])})", flush=True)
    model = model.to(device)
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
        if (step + 1) % log_every == 0:
            ce, ctc = torch.stack(losses[-log_every:]).mean(0).tolist()
            print(f"step {step + 1} loss {ce:.4f} ctc {ctc:.4f} lr {rate:.2e} "
                  f"{(time.time() - t_train) / (step + 1) * 1000:.0f} ms/step", flush=True)
        if eval_every and (step + 1) % eval_every == 0:
            # the held-out clips take the languages in turn; 200: the English-only run's
            part = held.head(max(200, EVAL_CLIPS * len(languages)))
            rows, hyps = heldout_report(model, tok, part, lead=lead)
            evals.append((step + 1, wer(part.texts, hyps), log_rows(rows)))
            print(f"step {step + 1} held-out WER ({len(part)} clips) {evals[-1][1]:.4f}", flush=True)
            print(format_rows(rows, f"step {step + 1}, language detected"), flush=True)
    else:
        step += 1
    train_s = time.time() - t_train
    rows, hyps = heldout_report(model, tok, held, lead=lead)
    forced_rows, _ = heldout_report(model, tok, held, lead=lead, forced=True)
    final_wer = wer(held.texts, hyps)
    print(f"final held-out WER ({len(held)} clips) {final_wer:.4f}", flush=True)
    print(format_rows(rows, "final, language detected"), flush=True)
    print(format_rows(forced_rows, "final, language forced"), flush=True)
    for ref, hyp in list(zip(held.texts, hyps))[:5]:
        print(f"  ref: {ref}\n  hyp: {hyp}")
    names_rows = names_report(model, tok, named, lead=lead) if named is not None else []
    if names_rows:
        print(format_names(names_rows, "held-out names set"), flush=True)

    out_dir.mkdir(parents=True, exist_ok=True)
    model.to("cpu").float().save_pretrained(out_dir, max_shard_size=shard_size)
    tok.save(str(out_dir / "tokenizer.json"))
    log = dict(init=str(init_dir) if init_dir else None, warm_start=str(warm_dir) if warm_dir else None,
               languages=[lang.name for lang in languages],
               seed=seed, steps=step, planned_steps=steps,
               batch_size=batch_size, clips=len(store), heldout_clips=len(held), lr=lr, warmup=warmup,
               lead_ms=lead_ms, lead_share=LEAD_SHARE, onset_share=ONSET_SHARE,
               digital_silence_share=DIGITAL_SILENCE_SHARE,
               hardware=hardware(device), device=device,
               torch=torch.__version__, synth_seconds=round(synth_s, 1), train_seconds=round(train_s, 1),
               wall_seconds=round(time.time() - t0, 1),
               final_loss=round(torch.stack(losses[-100:]).mean(0)[0].item(), 5),
               final_ctc_loss=round(torch.stack(losses[-100:]).mean(0)[1].item(), 5), ctc_weight=ctc_weight,
               heldout_wer=round(final_wer, 5), heldout_languages=log_rows(rows),
               heldout_forced=log_rows(forced_rows), evals=evals, name_share=name_share,
               heldout_names=[asdict(r) for r in names_rows],
               errors=[dict(language=n, ref=r, hyp=h) for n, r, h in zip(held.languages, held.texts, hyps)
                       if r != h][:50])
    (out_dir / "train_log.json").write_text(json.dumps(log, indent=1))
    print(json.dumps({k: v for k, v in log.items() if k != "errors"}), flush=True)

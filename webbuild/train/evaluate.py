"""Greedy transcription of held-out clips with the torch model: word error rate, and per language the
error rate (WER; CER for a language written without spaces) and how often the answer names the clip's
language.

`python -m webbuild.train.evaluate CKPT [N [LEAD_MS]] [--languages English,Russian] [--forced]` prints the
rows over the same N held-out clips per language that training evaluated (N = 500 by default), behind the
front-end's LEAD_MS of lead (model.yaml's default by default); `--forced` puts each clip's language's
answer prefix after the prompt (the page's language picker), so the language is right by construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click
import torch
from tokenizers import Tokenizer

from webbuild.reference.mel import DEFAULT_LEAD_MS, lead_samples
from webbuild.reference.prompt import parse_answer, parse_language
from webbuild.reference.wer import corpus_wer, edit_distance, normalize
from webbuild.text import plural
from webbuild.train.batches import ClipStore, features, token_batch
from webbuild.train.dataset import synthesize_sharded
from webbuild.train.languages import ENGLISH, LANGUAGES, parse_languages
from webbuild.train.names import names_in
from webbuild.train.sentences import HELDOUT_SEED, mixed_heldout

MAX_NEW_TOKENS = 64


def wer(refs: list[str], hyps: list[str]) -> float:
    return corpus_wer(list(zip(refs, hyps)))


def cer(refs: list[str], hyps: list[str]) -> float:
    """Character errors over reference characters, spaces and punctuation left out (webbuild.reference.wer's
    normalisation): the error rate of a language written without spaces."""
    chars = ["".join(normalize(t)) for t in refs], ["".join(normalize(t)) for t in hyps]
    errors = sum(edit_distance(r, h) for r, h in zip(*chars))
    return errors / max(sum(map(len, chars[0])), 1)


@dataclass(frozen=True)
class LanguageRow:
    language: str
    clips: int
    metric: str  # "WER", or "CER" for a language written without spaces
    error_rate: float
    language_right: float  # share of answers naming the clip's language

    def line(self) -> str:
        return (f"| {self.language} | {self.clips} | {self.metric} {100 * self.error_rate:.2f}% "
                f"| {100 * self.language_right:.1f}% |")


@torch.no_grad()
def decode(model, tok: Tokenizer, store: ClipStore, idx: torch.Tensor, lead: int = 0,
           forced: bool = False, max_new_tokens: int = MAX_NEW_TOKENS) -> list[str]:
    """Greedy decoding of clips `idx` in one left-padded batch, each behind `lead` samples of lead: the
    answers as decoded text, special tokens kept (`forced`: after each clip's language's answer prefix)."""
    device = store.pcm.device
    feats, mask = features(store, idx, lead=lead)
    ids, att, _ = token_batch(store, idx, mask, tok, train=False, forced=forced)
    end = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    out = model.generate(
        input_ids=ids.to(device), attention_mask=att.to(device), input_features=feats,
        input_features_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
        eos_token_id=end, pad_token_id=end[1],
    )
    return [tok.decode(row, skip_special_tokens=False) for row in out[:, ids.shape[1]:].tolist()]


def transcribe(model, tok: Tokenizer, store: ClipStore, idx: torch.Tensor, lead: int = 0) -> list[str]:
    """The transcripts of clips `idx` (decode's answers without their language tag)."""
    return [parse_answer(a) for a in decode(model, tok, store, idx, lead)]


def decode_all(model, tok: Tokenizer, store: ClipStore, batch_size: int = 128, lead: int = 0,
               forced: bool = False, max_new_tokens: int = MAX_NEW_TOKENS) -> list[str]:
    was_training = model.training
    model.eval()
    answers = []
    for start in range(0, len(store), batch_size):
        idx = torch.arange(start, min(start + batch_size, len(store)), device=store.pcm.device)
        answers += decode(model, tok, store, idx, lead, forced, max_new_tokens)
    model.train(was_training)
    return answers


def heldout_wer(model, tok: Tokenizer, store: ClipStore, batch_size: int = 128,
                lead: int = 0) -> tuple[float, list[str]]:
    hyps = [parse_answer(a) for a in decode_all(model, tok, store, batch_size, lead)]
    return wer(store.texts, hyps), hyps


def language_rows(texts: list[str], languages: list[str], answers: list[str],
                  forced: bool = False) -> list[LanguageRow]:
    """One row per language (in order of first appearance): its error rate and how often the answer named
    it. A forced answer starts after the language's prefix, so it names the forced one."""
    rows = []
    for name in dict.fromkeys(languages):
        at = [i for i, n in enumerate(languages) if n == name]
        refs, hyps = [texts[i] for i in at], [parse_answer(answers[i]) for i in at]
        spaced = LANGUAGES[name].spaces if name in LANGUAGES else True
        named = [name if forced else parse_language(answers[i]) for i in at]
        rows.append(LanguageRow(name, len(at), "WER" if spaced else "CER", (wer if spaced else cer)(refs, hyps),
                                sum(n == name for n in named) / len(at)))
    return rows


def heldout_report(model, tok: Tokenizer, store: ClipStore, batch_size: int = 128, lead: int = 0,
                   forced: bool = False, max_new_tokens: int = MAX_NEW_TOKENS) -> tuple[list[LanguageRow], list[str]]:
    """(the rows per language, each clip's transcript)."""
    answers = decode_all(model, tok, store, batch_size, lead, forced, max_new_tokens)
    return language_rows(store.texts, store.languages, answers, forced), [parse_answer(a) for a in answers]


@dataclass
class NamesRow:
    context: str  # "with context" or "without"
    language: str
    clips: int
    error_rate: float  # WER over the clips
    names_right: float  # share of the clips' names written exactly in their transcripts

    def line(self) -> str:
        return (f"| {self.context} | {self.language} | {self.clips} | WER {100 * self.error_rate:.2f}% "
                f"| {100 * self.names_right:.1f}% |")


def names_report(model, tok: Tokenizer, store: ClipStore, batch_size: int = 128, lead: int = 0) -> list[NamesRow]:
    """The held-out names set (train.names) transcribed with each clip's context text and without it: per
    language the WER and how many of the names come out exactly, the measure of a model that reads its context."""
    rows = []
    for label, clips in (("with context", store), ("without", store.without_contexts())):
        hyps = [parse_answer(a) for a in decode_all(model, tok, clips, batch_size, lead)]
        for language in dict.fromkeys(store.languages):
            at = [i for i, name in enumerate(store.languages) if name == language]
            names = [(n, hyps[i].split()) for i in at for n in names_in(store.texts[i], language)]
            right = sum(n in words for n, words in names) / max(1, len(names))
            rows.append(NamesRow(label, language, len(at), wer([store.texts[i] for i in at], [hyps[i] for i in at]),
                                 right))
    return rows


def format_names(rows: list[NamesRow], title: str) -> str:
    head = f"{title}\n| context | language | clips | error rate | names right |\n| --- | --- | --- | --- | --- |"
    return "\n".join([head] + [row.line() for row in rows])


def format_rows(rows: list[LanguageRow], title: str) -> str:
    head = f"{title}\n| language | clips | error rate | language named |\n| --- | --- | --- | --- |"
    return "\n".join([head] + [row.line() for row in rows])


def heldout_clips(languages: tuple, per_language: int):
    """The held-out clips of `languages`, the same that training evaluates on."""
    texts, names = mixed_heldout(languages, per_language)
    return synthesize_sharded(texts, HELDOUT_SEED, languages=names)


@click.command()
@click.argument("ckpt", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("n", type=int, default=500)
@click.argument("lead_ms", type=int, default=DEFAULT_LEAD_MS)
@click.option("--languages", "names", default=ENGLISH.name, show_default=True,
              help="comma-separated languages (or 'all') whose held-out clips to score")
@click.option("--forced", is_flag=True, help="force each clip's language (its answer prefix after the prompt)")
def main(ckpt: Path, n: int, lead_ms: int, names: str, forced: bool):
    """Score checkpoint CKPT on N held-out clips per language, behind LEAD_MS of lead."""
    from transformers import Qwen3ASRForConditionalGeneration

    try:
        languages = parse_languages(names)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--languages") from None
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    model = Qwen3ASRForConditionalGeneration.from_pretrained(ckpt).eval()
    store = ClipStore.build(heldout_clips(languages, n), tok, "cpu")
    rows, hyps = heldout_report(model, tok, store, batch_size=64, lead=lead_samples(lead_ms), forced=forced)
    print(f"held-out WER over {plural(len(store), 'clip')}, {lead_ms} ms lead: {wer(store.texts, hyps):.4f}")
    print(format_rows(rows, "language forced" if forced else "language detected"))


if __name__ == "__main__":
    main()

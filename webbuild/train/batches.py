"""Training/eval batches: prompt + answer token ids, labels on the answer only, GPU features."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tokenizers import Tokenizer

from webbuild.reference.prompt import answer_text, audio_token_count, build_prompt
from webbuild.train.dataset import Clips
from webbuild.train.features import log_mel_batch

IGNORE = -100


@dataclass
class ClipStore:
    """All clips on one device: int16 samples back to back, plus tokenized answers."""

    pcm: torch.Tensor  # int16 [N]
    offsets: torch.Tensor  # int64 [clips]
    lengths: torch.Tensor  # int64 [clips]
    texts: list[str]
    answers: list[list[int]]  # `language <Name><asr_text>text<|im_end|>`, the clip's language named
    words: list[list[int]]  # transcript tokens alone (the CTC target)
    languages: list[str]  # each clip's language name
    contexts: list[str]  # each clip's context text for its prompt's system message ('': none; train.names)

    @classmethod
    def build(cls, clips: Clips, tok: Tokenizer, device: str, contexts: list[str] | None = None) -> ClipStore:
        answers = [tok.encode(answer_text(t, lang), add_special_tokens=False).ids
                   for t, lang in zip(clips.texts, clips.languages)]
        words = [tok.encode(t, add_special_tokens=False).ids for t in clips.texts]
        as_t = lambda a: torch.as_tensor(a).to(device)  # noqa: E731
        return cls(as_t(clips.pcm), as_t(clips.offsets), as_t(clips.lengths), clips.texts, answers, words,
                   clips.languages, list(contexts) if contexts is not None else [""] * len(clips.texts))

    def head(self, n: int) -> ClipStore:
        """The first `n` clips (sharing the sample storage)."""
        return ClipStore(self.pcm, self.offsets[:n], self.lengths[:n], self.texts[:n], self.answers[:n], self.words[:n],
                         self.languages[:n], self.contexts[:n])

    def without_contexts(self) -> ClipStore:
        """The same clips with no context text."""
        return ClipStore(self.pcm, self.offsets, self.lengths, self.texts, self.answers, self.words, self.languages,
                         [""] * len(self.texts))

    def __len__(self) -> int:
        return len(self.texts)


def features(store: ClipStore, idx: torch.Tensor, random_pad: bool = False, lead: int = 0, lead_share: float = 1.0):
    """Log-mel features and mask of clips `idx`, `lead_share` of them behind the front-end's `lead`
    samples of lead (the others behind none). With `random_pad`, the padding frames of each
    clip hold either 0 or the clip's floor value, so the encoder tolerates either convention."""
    leads = torch.full_like(idx, lead)
    if lead and lead_share < 1.0:
        leads = leads * (torch.rand(len(idx), device=idx.device) < lead_share)
    feats, mask = log_mel_batch(store.pcm, store.offsets[idx], store.lengths[idx], 1 / 32767.0, leads)
    if random_pad:
        floor = feats.amax(dim=(1, 2)) - 2.0  # the clip's log10 floor (max - 8), normalised
        use_floor = torch.rand(len(idx), device=feats.device) < 0.5
        fill = torch.where(use_floor, floor, torch.zeros_like(floor))[:, None, None]
        feats = torch.where(mask[:, None, :].bool(), feats, fill)
    return feats, mask


def token_batch(store: ClipStore, idx: torch.Tensor, mask: torch.Tensor, tok: Tokenizer, train: bool,
                forced: bool = False):
    """input_ids, attention_mask and labels. Training rows hold prompt + answer, right-padded;
    eval rows hold the prompt only, left-padded for generation; `forced`: each eval prompt ends with its
    clip's language's answer prefix (the forced language), so decoding starts at the text. Each prompt's system
    message holds its clip's context text."""
    pad = tok.token_to_id("<|endoftext|>")
    rows, labels = [], []
    for i, frames in zip(idx.tolist(), mask.sum(1).tolist()):
        forced_language = store.languages[i] if forced and not train else None
        prompt = build_prompt(tok, audio_token_count(int(frames)), forced_language, store.contexts[i]).ids
        answer = store.answers[i] if train else []
        rows.append(prompt + answer)
        labels.append([IGNORE] * len(prompt) + answer)
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    lab = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    att = torch.zeros((len(rows), width), dtype=torch.long)
    for r, (row, lrow) in enumerate(zip(rows, labels)):
        sl = slice(0, len(row)) if train else slice(width - len(row), width)
        ids[r, sl], lab[r, sl], att[r, sl] = torch.tensor(row), torch.tensor(lrow), 1
    return ids, att, lab

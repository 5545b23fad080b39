"""Byte-level BPE tokenizers carrying the Qwen3-ASR special tokens.

Two shapes come out of one builder:
- compact (the trained tiny model): special tokens follow the BPE vocabulary directly;
- Qwen-sized (zoo presets 0.6b/1.7b): the vocabulary is padded with unreachable filler tokens so
  that every special token sits at the id the published Qwen3-ASR tokenizer gives it.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

# Special tokens of the published Qwen3-ASR tokenizer and their ids there.
QWEN_SPECIAL_IDS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|audio_start|>": 151669,
    "<|audio_end|>": 151670,
    "<|audio_pad|>": 151676,
    "<asr_text>": 151704,
}
QWEN_VOCAB_SIZE = 151936  # embedding rows of the published models (padded past the last token)
SPECIAL_TOKENS = list(QWEN_SPECIAL_IDS)


def _bpe_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def train_bpe(texts: Iterable[str], bpe_vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE on `texts` (no special tokens yet)."""
    tok = _bpe_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def add_special_tokens(tok: Tokenizer, qwen_ids: bool) -> Tokenizer:
    """Add the Qwen3-ASR special tokens; with `qwen_ids`, at their published ids.

    Filler tokens `<|reserved_N|>` pad the vocabulary so the ids line up; they are never produced
    by encoding text.
    """
    if not qwen_ids:
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
        return tok
    next_id = tok.get_vocab_size(with_added_tokens=True)
    last_special = max(QWEN_SPECIAL_IDS.values())
    if next_id > min(QWEN_SPECIAL_IDS.values()):
        raise ValueError(f"BPE vocabulary ({next_id}) overlaps the Qwen special-token ids")
    by_id = {v: k for k, v in QWEN_SPECIAL_IDS.items()}
    tokens = [by_id.get(i, f"<|reserved_{i}|>") for i in range(next_id, last_special + 1)]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tokens])
    return tok


def build_tokenizer(texts: Iterable[str], bpe_vocab_size: int, qwen_ids: bool = False) -> Tokenizer:
    tok = add_special_tokens(train_bpe(texts, bpe_vocab_size), qwen_ids)
    for name in SPECIAL_TOKENS:
        if tok.token_to_id(name) is None:
            raise AssertionError(f"special token {name} missing")
    return tok


def special_ids(tok: Tokenizer) -> dict[str, int]:
    """The ids of the special tokens in `tok`, by token text."""
    ids = {}
    for name in SPECIAL_TOKENS:
        tid = tok.token_to_id(name)
        if tid is None:
            raise ValueError(f"tokenizer lacks the Qwen3-ASR special token {name}")
        ids[name] = tid
    return ids

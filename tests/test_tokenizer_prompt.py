"""Tokenizers with the Qwen3-ASR special tokens, and the chat prompt."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models

from webbuild.errors import SourceError
from webbuild.reference.prompt import PROMPT_PREFIX, PROMPT_SUFFIX, audio_token_count, build_prompt, parse_answer
from webbuild.reference.tokenizer import QWEN_SPECIAL_IDS, build_tokenizer

TEXT = ["the quick brown fox jumps over the lazy dog system user assistant language English"] * 5


def test_qwen_ids_land_at_published_positions():
    tok = build_tokenizer(TEXT, 300, qwen_ids=True)
    for name, tid in QWEN_SPECIAL_IDS.items():
        assert tok.token_to_id(name) == tid


def test_compact_tokenizer_roundtrip():
    tok = build_tokenizer(TEXT, 300)
    assert tok.get_vocab_size() < 400
    ids = tok.encode("the lazy fox").ids
    assert tok.decode(ids) == "the lazy fox"


def test_prompt_structure():
    tok = build_tokenizer(TEXT, 300)
    p = build_prompt(tok, 26)
    pad = tok.token_to_id("<|audio_pad|>")
    assert p.ids[p.audio_offset:p.audio_offset + 26] == [pad] * 26
    assert pad not in p.ids[:p.audio_offset] + p.ids[p.audio_offset + 26:]
    text = tok.decode(p.ids, skip_special_tokens=False)
    assert text == PROMPT_PREFIX + "<|audio_pad|>" * 26 + PROMPT_SUFFIX


def test_prompt_of_a_tokenizer_without_audio_pad_is_refused():
    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    with pytest.raises(SourceError, match="audio_pad"):
        build_prompt(tok, 26)


def test_audio_token_count_13_per_second():
    assert audio_token_count(100) == 13
    assert audio_token_count(1000) == 130
    assert audio_token_count(150) == 13 + 7
    assert audio_token_count(1) == 1


def test_parse_answer():
    assert parse_answer("language English<asr_text>hello world<|im_end|>") == "hello world"


def test_site_codec_gives_ids_beyond_its_table_no_bytes_as_the_page_does():
    """Random or untrained weights pick ids past the tokenizer's table (logits are wider than the vocabulary):
    runtime/tokens.js gives them no bytes, and so must the reference that `webbuild verify` compares with."""
    import numpy as np

    from webbuild.pipeline.assemble import token_table
    from webbuild.reference.transcribe import SiteCodec

    tok = build_tokenizer(["hello world"] * 4, 300)
    table = token_table(tok)
    codec = SiteCodec({"prompt": {"prefix": [], "suffix": [], "audio_pad": 0}}, table)
    count = int(np.frombuffer(table, "<u4", 1)[0])
    hello = tok.encode("hello").ids[0]
    assert codec.decode([hello, count, count + 5, -1, hello]) == codec.decode([hello, hello])

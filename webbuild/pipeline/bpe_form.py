"""What the page needs to tokenise a visitor's context text itself (runtime/bpe.js), from tokenizer.json:
the pre-tokeniser's regex as a JavaScript pattern, the normaliser, and the BPE merges by rank as id pairs
(appended to the decode table, tokens.bin). Byte-level BPE tokenizers of two shapes are read: the GPT-2 form
(a ByteLevel pre-tokeniser with its own regex: webbuild's own and the zoo's tokenizers) and Qwen2's
(an NFC normaliser, a Split on Qwen2's regex, then ByteLevel without regex: the published Qwen3-ASR's)."""

from __future__ import annotations

import json
import re
import struct

from tokenizers import Tokenizer

# tokenizers' ByteLevel(use_regex=True) splits on GPT-2's pattern
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def encoder_form(tok: Tokenizer) -> dict | None:
    """runtime.json prompt.context's encoder keys (pattern, nfc, ignore_merges), or None where the tokenizer is
    not a byte-level BPE of a shape runtime/bpe.js reproduces (one adding a prefix space is not)."""
    spec = json.loads(tok.to_str())
    model, norm, pre = spec["model"], spec.get("normalizer"), spec.get("pre_tokenizer")
    if model.get("type") != "BPE" or model.get("byte_fallback") or model.get("continuing_subword_prefix") \
            or model.get("end_of_word_suffix") or model.get("dropout"):
        return None
    if norm is not None and norm.get("type") != "NFC":
        return None
    split = _split_pattern(pre)
    if split is None:
        return None
    return {"pattern": js_pattern(split), "nfc": norm is not None, "ignore_merges": bool(model.get("ignore_merges"))}


def _split_pattern(pre: dict | None) -> str | None:
    """The regex of a ByteLevel pre-tokeniser without a prefix space, alone or after one isolating Split."""
    if pre is None:
        return None
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space"):
        return GPT2_PATTERN
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else []
    if len(steps) != 2:
        return None
    split, byte_level = steps
    regex = split.get("pattern", {}).get("Regex")
    if (split.get("type") != "Split" or regex is None or split.get("behavior") != "Isolated" or split.get("invert")
            or byte_level.get("type") != "ByteLevel" or byte_level.get("use_regex", True)
            or byte_level.get("add_prefix_space")):
        return None
    return regex


def js_pattern(pattern: str) -> str:
    """A tokenizers (Oniguruma) pattern as JavaScript's (with the u flag): inline case-insensitive groups
    `(?i:...)`, which JavaScript engines before 2024 lack, become groups of both-case letter classes; `\\s` and
    `\\S` become the White_Space property, Oniguruma's `\\s` (JavaScript's adds U+FEFF and lacks U+0085)."""
    def fold(group: re.Match) -> str:
        return "(?:" + re.sub(r"[A-Za-z]", lambda c: f"[{c[0].lower()}{c[0].upper()}]", group[1]) + ")"
    spaces = re.sub(r"(?<!\\)\\s", r"\\p{White_Space}", pattern)
    spaces = re.sub(r"(?<!\\)\\S", r"\\P{White_Space}", spaces)
    return re.sub(r"\(\?i:([^()]*)\)", fold, spaces)


def merge_pairs(tok: Tokenizer) -> list[tuple[int, int]]:
    """The BPE merges by rank, each as the ids of its two parts."""
    spec = json.loads(tok.to_str())["model"]
    vocab = spec["vocab"]
    pairs = [m.split(" ", 1) if isinstance(m, str) else m for m in spec["merges"]]
    return [(vocab[a], vocab[b]) for a, b in pairs]


def merges_section(tok: Tokenizer) -> bytes:
    """u32 count, then each merge's two u32 ids, by rank (what tokens.bin carries after the token bytes)."""
    pairs = merge_pairs(tok)
    return struct.pack(f"<{1 + 2 * len(pairs)}I", len(pairs), *(i for pair in pairs for i in pair))

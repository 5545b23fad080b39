"""A built site's text encoder, from what it ships (runtime.json prompt.context, tokens.bin's token bytes and
merges), as the page's runtime/bpe.js reads them: the reference tokenises context text for a built site the
way its page does, through the tokenizers library rebuilt from those files."""

from __future__ import annotations

import numpy as np
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers


def byte_to_unicode() -> list[str]:
    """GPT-2's byte alphabet: the character each byte is written as in a byte-level BPE vocabulary."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = [], 0
    for b in range(256):
        if b in keep:
            table.append(chr(b))
        else:
            table.append(chr(256 + extra))
            extra += 1
    return table


def merges_of(table: bytes) -> list[tuple[int, int]]:
    """The merges tokens.bin carries after its token bytes, by rank, as id pairs (none in older builds)."""
    count = int(np.frombuffer(table, "<u4", 1)[0])
    offsets = np.frombuffer(table, "<u4", count + 1, offset=4)
    at = 4 * (count + 2) + int(offsets[-1])
    if len(table) < at + 4:
        return []
    n = int(np.frombuffer(table, "<u4", 1, offset=at)[0])
    pairs = np.frombuffer(table, "<u4", 2 * n, offset=at + 4).reshape(n, 2)
    return [(int(a), int(b)) for a, b in pairs]


def site_tokenizer(context: dict, token_bytes: list[bytes], merges: list[tuple[int, int]]) -> Tokenizer:
    """A Tokenizer encoding plain text as the site's page does. Tokens are named by their bytes in GPT-2's byte
    alphabet; the first id of a name is its id (the BPE tokens come before the added ones, whose text no merge
    makes)."""
    alphabet = byte_to_unicode()
    names = ["".join(alphabet[b] for b in raw) for raw in token_bytes]
    vocab: dict[str, int] = {}
    for i, name in enumerate(names):
        if name:
            vocab.setdefault(name, i)
    bpe = models.BPE(vocab, [(names[a], names[b]) for a, b in merges], ignore_merges=context["ignore_merges"])
    tok = Tokenizer(bpe)
    if context["nfc"]:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(context["pattern"]), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return tok

"""Random-word sentences over the example vocabulary, with a fixed held-out set.

Sentences are uniform random word sequences (no grammar) so the model must listen rather than
guess from context. The held-out set is a fixed seeded draw; training draws skip any sentence in
it, so evaluation never sees a training sentence.
"""

from __future__ import annotations

import random
from pathlib import Path

VOCABULARY = Path(__file__).resolve().with_name("vocabulary.txt")  # package data: training runs from a wheel too
MIN_WORDS, MAX_WORDS = 3, 12
HELDOUT_SEED = 20261129  # fixed: the held-out set must not depend on the training seed
HELDOUT_SIZE = 500


def load_vocabulary(path: Path = VOCABULARY) -> list[str]:
    words = [w.strip() for w in Path(path).read_text().splitlines() if w.strip()]
    if not all(w.isalpha() and w.islower() for w in words):
        raise ValueError(f"{path}: vocabulary must be lower-case letters only")
    return words


def random_sentence(rng: random.Random, vocab: list[str]) -> str:
    return " ".join(rng.choices(vocab, k=rng.randint(MIN_WORDS, MAX_WORDS)))


def heldout_sentences(vocab: list[str], n: int = HELDOUT_SIZE) -> list[str]:
    """The first `n` sentences of the fixed held-out draw (a prefix of the same list for any n)."""
    rng = random.Random(HELDOUT_SEED)
    return [random_sentence(rng, vocab) for _ in range(n)]


def training_sentences(vocab: list[str], n: int, seed: int) -> list[str]:
    """`n` seeded sentences, none of them in the held-out set."""
    heldout = set(heldout_sentences(vocab))
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < n:
        s = random_sentence(rng, vocab)
        if s not in heldout:
            out.append(s)
    return out

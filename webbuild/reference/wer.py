"""Word error rate with the documented normalisation: case and punctuation do not count."""

from __future__ import annotations

import re
from collections.abc import Sequence

_NON_WORD = re.compile(r"[^\w']+")


def normalize(text: str) -> list[str]:
    """Lower-case words; punctuation (except apostrophes inside words) becomes a separator."""
    return [w.strip("'") for w in _NON_WORD.sub(" ", text.lower()).split() if w.strip("'")]


def edit_distance(ref: Sequence, hyp: Sequence) -> int:
    """Levenshtein distance between two sequences (words, token ids, ...)."""
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


def word_errors(ref: str, hyp: str) -> tuple[int, int]:
    """(substitutions + deletions + insertions, reference word count)."""
    r = normalize(ref)
    return edit_distance(r, normalize(hyp)), len(r)


def wer(ref: str, hyp: str) -> float:
    errors, words = word_errors(ref, hyp)
    return errors / max(words, 1)


def corpus_wer(pairs: list[tuple[str, str]]) -> float:
    """Total errors over total reference words (not the mean of per-clip rates)."""
    errors = words = 0
    for ref, hyp in pairs:
        e, w = word_errors(ref, hyp)
        errors, words = errors + e, words + w
    return errors / max(words, 1)

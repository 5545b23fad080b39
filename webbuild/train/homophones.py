"""Find words that espeak-ng pronounces identically (the model cannot tell them apart).

Used once to clean `webbuild/train/vocabulary/en-us.txt`:
`python -m webbuild.train.homophones webbuild/train/vocabulary/en-us.txt` prints each clash (in en-us and
en-gb-x-rp; VOICE arguments after the file name others: `... vocabulary/ru.txt ru ru-lv`).
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

VOICES = ("en-us", "en-gb-x-rp")


def phonemes(word: str, voice: str) -> str:
    """espeak-ng's phoneme string for `word`, stress marks dropped (they do not separate words)."""
    out = subprocess.run(["espeak-ng", "-q", "-x", "-v", voice, word], capture_output=True, text=True, check=True)
    return out.stdout.strip().replace("'", "").replace(",", "")


def clashes(words: list[str], voices=VOICES) -> list[list[str]]:
    """Groups of words that share a pronunciation in any of `voices`."""
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    with ThreadPoolExecutor(8) as pool:
        for voice in voices:
            for word, ph in zip(words, pool.map(lambda w, voice=voice: phonemes(w, voice), words)):
                groups[(voice, ph)].append(word)
    seen, out = set(), []
    for group in groups.values():
        key = tuple(sorted(group))
        if len(group) > 1 and key not in seen:
            seen.add(key)
            out.append(list(key))
    return out


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        vocab = [w.strip() for w in f if w.strip()]
    for group in clashes(vocab, tuple(sys.argv[2:]) or VOICES):
        print(" ".join(group))

"""Write the non-English word lists of the tiny example (webbuild/train/vocabulary/<voice>.txt), once, at
development time. Needs `wordfreq` (3.1.1 made the committed lists), which nothing in webbuild imports,
and espeak-ng:

    python -m venv /tmp/wf && /tmp/wf/bin/pip install wordfreq==3.1.1
    PYTHONPATH=. /tmp/wf/bin/python scripts/make_vocabulary.py [LANGUAGE ...]

Per language, from wordfreq's most frequent words: lower case, 2 to 12 letters (English's longest word
has 11), only the language's letters (webbuild.train.languages) and at least one vowel (no
abbreviations such as `км`); Greek's final sigma restored (wordfreq folds ς into σ); no word more
frequent in English than in the language, nor any word of the English list (vocabulary/en-us.txt: the
same spelling would name two languages); no word espeak-ng reads in another language (its phonemes
switch, e.g. `(en)`); of words espeak-ng says alike in any of the language's voices, the most frequent
only. The first WORDS survivors, sorted.
"""

from __future__ import annotations

import argparse
import re
from concurrent.futures import ThreadPoolExecutor

from webbuild.train.homophones import phonemes
from webbuild.train.languages import ENGLISH, LANGUAGES, Language

WORDS = 1500
CANDIDATES = 6000  # wordfreq's top words looked at per language
CODES = {"German": "de", "French": "fr", "Spanish": "es", "Russian": "ru", "Greek": "el"}
LETTERS = (2, 12)
VOWELS = {"German": "aeiouyäöü", "French": "aeiouyàâæéèêëîïôœùûüÿ", "Spanish": "aeiouyáéíóúü",
          "Russian": "аеёиоуыэюя", "Greek": "αεηιουωάέήίόύώϊϋΐΰ"}


def restore_final_sigma(word: str) -> str:
    return re.sub("σ$", "ς", word)


def spelled_right(word: str, lang: Language) -> bool:
    return (LETTERS[0] <= len(word) <= LETTERS[1] and word == word.lower() and all(c in lang.letters for c in word)
            and any(c in VOWELS[lang.name] for c in word))


def candidates(lang: Language) -> list[str]:
    from wordfreq import top_n_list, word_frequency  # a development tool's, not webbuild's: imported when used

    code, out = CODES[lang.name], []
    english = set(ENGLISH.vocabulary.read_text(encoding="utf-8").split())
    for word in top_n_list(CODES[lang.name], CANDIDATES):
        word = restore_final_sigma(word) if lang.name == "Greek" else word
        if (spelled_right(word, lang) and word_frequency(word, "en") <= word_frequency(word, code)
                and word not in english and word not in out):
            out.append(word)
    return out


def pronounced(words: list[str], lang: Language) -> dict[str, list[str]]:
    """Each word's phonemes in each of the language's voices."""
    with ThreadPoolExecutor(8) as pool:
        by_voice = [list(pool.map(lambda w, v=voice: phonemes(w, v), words)) for voice in lang.voices]
    return {w: [ph[i] for ph in by_voice] for i, w in enumerate(words)}


def word_list(lang: Language) -> list[str]:
    words = candidates(lang)
    said = pronounced(words, lang)
    seen: set[tuple[int, str]] = set()
    kept = []
    for word in words:  # most frequent first: it keeps the pronunciation
        sounds = {(i, ph) for i, ph in enumerate(said[word])}
        if any("(" in ph for ph in said[word]) or sounds & seen:
            continue
        seen |= sounds
        kept.append(word)
        if len(kept) == WORDS:
            break
    return sorted(kept)


def main(names: list[str]) -> None:
    for name in names or list(CODES):
        lang = LANGUAGES[name]
        words = word_list(lang)
        lang.vocabulary.write_text("\n".join(words) + "\n")
        print(f"{name}: {len(words)} words -> {lang.vocabulary}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("languages", nargs="*", metavar="LANGUAGE", help=f"default: {' '.join(CODES)}")
    main(ap.parse_args().languages)

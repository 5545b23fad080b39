"""Rare names and the context text that gives them (issue 50, part 3: a model that reads its context).

The vocabularies hold common words only, so a name the model never heard is beyond spelling from the audio
alone. Training clips with a name in their sentence carry the name in their context text, among distractor
names; a model that learns to copy from its context writes such names right when given them, and the held-out
names set measures exactly that: the same clips with the context and without.

A name is a pseudo-word of two to four consonant-vowel syllables in the language's own letters (espeak-ng reads
it by the language's spelling rules), never a word of the language's vocabulary. Which clips get one, which word
it replaces and the distractors are seeded draws, so the same seed gives the same data.
"""

from __future__ import annotations

import random
from functools import cache

from webbuild.train.languages import LANGUAGES, Language
from webbuild.train.sentences import HELDOUT_SEED, language_heldout, load_vocabulary

# consonants and vowels each language spells plainly (one letter, one sound, in espeak-ng's rules)
SYLLABLES = {
    "English": ("bdfgklmnprstvz", "aeiou"),
    "German": ("bdfgklmnprstz", "aeiou"),
    "French": ("bdfgklmnprstv", "aeiou"),
    "Spanish": ("bdfgklmnprst", "aeiou"),
    "Russian": ("бвгдзклмнпрст", "аеиоу"),
    "Greek": ("βγδζκλμνπρστ", "αειου"),
}
NAME_SEED = 8_000_008  # added to a run's seed: the names' draws are their own stream
DISTRACTORS = (0, 3)  # distractor names in a context, at least and at most
EMPTY_CONTEXT_SHARE = 0.1  # of the clips without a name: a context of distractors only (nothing to copy)


@cache
def _vocabulary(language: str) -> frozenset[str]:
    return frozenset(load_vocabulary(LANGUAGES[language].vocabulary))


def pseudo_name(rng: random.Random, lang: Language) -> str:
    """A name of `lang`'s letters that is no word of its vocabulary."""
    consonants, vowels = SYLLABLES[lang.name]
    while True:
        name = "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(rng.randint(2, 4)))
        if name not in _vocabulary(lang.name):
            return name


def with_names(texts: list[str], languages: list[str], share: float, seed: int) -> list[str]:
    """`texts` with one word of `share` of them (a seeded draw) replaced by a rare name of the clip's language."""
    if share <= 0:
        return list(texts)
    rng = random.Random(seed + NAME_SEED)
    out = []
    for text, language in zip(texts, languages):
        words = text.split()
        if rng.random() < share:
            words[rng.randrange(len(words))] = pseudo_name(rng, LANGUAGES[language])
        out.append(" ".join(words))
    return out


def names_in(text: str, language: str) -> list[str]:
    """The words of `text` its language's vocabulary lacks: the names with_names put in."""
    vocabulary = _vocabulary(language)
    return [w for w in text.split() if w not in vocabulary]


def contexts(texts: list[str], languages: list[str], seed: int) -> list[str]:
    """Each clip's context text: its names among distractor names, shuffled, comma-separated; for
    EMPTY_CONTEXT_SHARE of the clips without a name, distractors alone; '' for the others."""
    rng = random.Random(seed + NAME_SEED + 1)
    out = []
    for text, language in zip(texts, languages):
        names = names_in(text, language)
        if not names and rng.random() >= EMPTY_CONTEXT_SHARE:
            out.append("")
            continue
        listed = names + [pseudo_name(rng, LANGUAGES[language]) for _ in range(rng.randint(*DISTRACTORS))]
        rng.shuffle(listed)
        out.append(", ".join(listed or [pseudo_name(rng, LANGUAGES[language])]))
    return out


NAMES_HELDOUT = 100  # clips per language in the names set: its last held-out sentences, each given a name


def names_heldout(langs: tuple[Language, ...], per_language: int = NAMES_HELDOUT) -> tuple[list[str], list[str]]:
    """(sentences, their language names) of the held-out names set: each language's last `per_language` held-out
    sentences, the languages in turn, a rare name in every one (their contexts: contexts(..., HELDOUT_SEED))."""
    sets = [language_heldout(lang)[-per_language:] for lang in langs]
    order = [(k, i) for k in range(per_language) for i in range(len(langs))]
    texts, names = [sets[i][k] for k, i in order], [langs[i].name for _, i in order]
    return with_names(texts, names, 1.0, HELDOUT_SEED), names

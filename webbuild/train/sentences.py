"""Random-word sentences over each language's vocabulary, with a fixed held-out set per language.

Sentences are uniform random word sequences (no grammar) so the model must listen rather than
guess from context. Each language's held-out set is a fixed seeded draw (HELDOUT_SEED plus the
language's offset: English's is the set it always was); training draws skip any sentence in it, so
evaluation never sees a training sentence.

A multilingual set picks each clip's language uniformly at random (seeded), then draws its sentence
from that language's own stream; the held-out set takes the languages in turn (clip k speaks language
k mod L), so any prefix of it holds every language about equally.
"""

from __future__ import annotations

import random
from pathlib import Path

from webbuild.train.languages import ENGLISH, Language

VOCABULARY = ENGLISH.vocabulary
MIN_WORDS, MAX_WORDS = 3, 12
HELDOUT_SEED = 20261129  # fixed: the held-out set must not depend on the training seed
HELDOUT_SIZE = 500  # per language
TOKENIZER_SENTENCES = 20000  # in all, an equal share of each language's
TOKENIZER_SEED = 0  # the tokenizer does not depend on the run's seed or clip count
PROMPT_WORDS = ["system", "user", "assistant"]
# Cyrillic and Greek letters are two bytes each: with the tiny preset's 1024 tokens the six languages'
# merges left Russian held-out answers up to 65 tokens (Greek 64), past the decode's 64
# (evaluate.MAX_NEW_TOKENS, the site's max_new_tokens); 2048 brings every language's longest to 51
MULTILINGUAL_BPE_VOCAB_SIZE = 2048


def load_vocabulary(path: Path = VOCABULARY) -> list[str]:
    words = [w.strip() for w in Path(path).read_text(encoding="utf-8").splitlines() if w.strip()]
    bad = next((w for w in words if not (w.isalpha() and w.islower())), None)
    if bad is not None:
        raise ValueError(f"{path}: {bad!r} is not a lower-case word; a vocabulary holds lower-case letters only, "
                         "one word a line")
    return words


def random_sentence(rng: random.Random, vocab: list[str]) -> str:
    return " ".join(rng.choices(vocab, k=rng.randint(MIN_WORDS, MAX_WORDS)))


def heldout_sentences(vocab: list[str], n: int = HELDOUT_SIZE, seed: int = HELDOUT_SEED) -> list[str]:
    """The first `n` sentences of the fixed held-out draw (a prefix of the same list for any n)."""
    rng = random.Random(seed)
    return [random_sentence(rng, vocab) for _ in range(n)]


def training_sentences(vocab: list[str], n: int, seed: int, heldout_seed: int = HELDOUT_SEED) -> list[str]:
    """`n` seeded sentences, none of them in the held-out set drawn from `heldout_seed`."""
    heldout = set(heldout_sentences(vocab, seed=heldout_seed))
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < n:
        s = random_sentence(rng, vocab)
        if s not in heldout:
            out.append(s)
    return out


def language_heldout(lang: Language, n: int = HELDOUT_SIZE) -> list[str]:
    """`lang`'s fixed held-out sentences (English: the held-out set of the English-only model)."""
    return heldout_sentences(load_vocabulary(lang.vocabulary), n, HELDOUT_SEED + lang.seed_offset)


def language_training(lang: Language, n: int, seed: int) -> list[str]:
    """`n` training sentences of `lang`, none in its held-out set."""
    return training_sentences(load_vocabulary(lang.vocabulary), n, seed + lang.seed_offset,
                              HELDOUT_SEED + lang.seed_offset)


def mixed_training(langs: tuple[Language, ...], n: int, seed: int) -> tuple[list[str], list[str]]:
    """(sentences, their language names): each clip's language uniform over `langs`. With English alone,
    the sentences of `training_sentences(english, n, seed)`."""
    rng = random.Random(seed)
    picks = [rng.randrange(len(langs)) for _ in range(n)] if len(langs) > 1 else [0] * n
    streams = [iter(language_training(lang, picks.count(i), seed)) for i, lang in enumerate(langs)]
    return [next(streams[i]) for i in picks], [langs[i].name for i in picks]


def mixed_heldout(langs: tuple[Language, ...], per_language: int) -> tuple[list[str], list[str]]:
    """(sentences, their language names): each language's first `per_language` held-out sentences, the
    languages in turn."""
    sets = [language_heldout(lang, per_language) for lang in langs]
    order = [(k, i) for k in range(per_language) for i in range(len(langs))]
    return [sets[i][k] for k, i in order], [langs[i].name for _, i in order]


def tokenizer_texts(langs: tuple[Language, ...]) -> list[str]:
    """The tokenizer's fixed training mix: each language's share of TOKENIZER_SENTENCES training sentences,
    and the prompt's words with each language's answer tag. English alone: the texts the English
    tokenizer always had."""
    share = TOKENIZER_SENTENCES // len(langs)
    texts = [s for lang in langs for s in language_training(lang, share, TOKENIZER_SEED)]
    return texts + (PROMPT_WORDS + [f"language {lang.name}" for lang in langs]) * 1000


def tokenizer_size(languages: tuple[Language, ...], preset_size: int) -> int:
    """The preset's BPE size for one language (English: the shipped model's tokenizer), else the larger one."""
    return preset_size if len(languages) == 1 else max(preset_size, MULTILINGUAL_BPE_VOCAB_SIZE)

"""The languages the tiny example is trained on: Qwen3-ASR's name for each, its espeak-ng voices, its
word list (package data, `vocabulary/<voice>.txt`) and its letters.

Names are the ones Qwen3-ASR's answers give (`language <Name><asr_text>...`; transformers'
`processing_qwen3_asr.LANGUAGE_CODE_TO_NAME`). Each language's held-out sentences and training draws
use their own seeds (`seed_offset` from the run's); English's offset is 0, so an English-only run
draws the sentences, voices and held-out set it always did.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

VOCABULARY_DIR = Path(__file__).resolve().with_name("vocabulary")  # package data: runs from a wheel too
_LATIN = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class Language:
    name: str  # as Qwen3-ASR's answers name it
    voice: str  # the espeak-ng voice its word list is named after and checked with
    voices: tuple[str, ...]  # espeak-ng voices its clips are spoken with (each with a random variant)
    letters: str  # every letter its words may hold (lower case)
    seed_offset: int  # added to the run's seed and to the held-out seed: each language draws its own
    spaces: bool = True  # written with spaces between words: scored by WER, else by CER

    @property
    def vocabulary(self) -> Path:
        return VOCABULARY_DIR / f"{self.voice}.txt"


LANGUAGES: dict[str, Language] = {lang.name: lang for lang in (
    Language("English", "en-us", ("en-us", "en", "en-gb-x-rp", "en-029", "en-gb-scotland"), _LATIN, 0),
    Language("German", "de", ("de",), _LATIN + "äöüß", 1_000_001),
    Language("French", "fr", ("fr", "fr-be", "fr-ch"), _LATIN + "àâæçéèêëîïôœùûüÿ", 2_000_002),
    Language("Spanish", "es", ("es", "es-419"), _LATIN + "áéíóúüñ", 3_000_003),
    Language("Russian", "ru", ("ru", "ru-lv"), "абвгдеёжзийклмнопрстуфхцчшщъыьэюя", 4_000_004),
    Language("Greek", "el", ("el",), "αβγδεζηθικλμνξοπρσςτυφχψωάέήίόύώϊϋΐΰ", 5_000_005),
)}
ENGLISH = LANGUAGES["English"]
MULTILINGUAL = tuple(LANGUAGES)  # the multilingual example's set (scripts/train_on_device.sh run)


def parse_languages(text: str) -> tuple[Language, ...]:
    """'English,Russian' -> those languages, in the order given; 'all' -> every one."""
    names = MULTILINGUAL if text.strip() == "all" else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in LANGUAGES]
    if unknown or not names:
        raise ValueError(f"no training data for {', '.join(unknown) or 'an empty list'}; "
                         f"name some of {', '.join(MULTILINGUAL)} (or 'all')")
    if len(set(names)) < len(names):
        raise ValueError("a language is named twice; name each once")
    return tuple(LANGUAGES[n] for n in names)

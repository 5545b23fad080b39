"""The multilingual training data: each language's word list, held-out set, answer format, shards and the
tokenizer's coverage of every script (no torch)."""

import shutil
import unicodedata

import numpy as np
import pytest

from webbuild.reference.prompt import answer_text, parse_answer, parse_language
from webbuild.reference.tokenizer import build_tokenizer
from webbuild.train.dataset import build_shards, load_shards
from webbuild.train.languages import ENGLISH, LANGUAGES, MULTILINGUAL, VOCABULARY_DIR, parse_languages
from webbuild.train.sentences import (
    HELDOUT_SEED,
    heldout_sentences,
    language_heldout,
    language_training,
    load_vocabulary,
    mixed_heldout,
    mixed_training,
    tokenizer_size,
    tokenizer_texts,
    training_sentences,
)

SCRIPTS = {"English": "LATIN", "German": "LATIN", "French": "LATIN", "Spanish": "LATIN", "Russian": "CYRILLIC",
           "Greek": "GREEK"}
# the multilingual tokenizer's mean tokens per word over each language's held-out sentences, measured
# (English 2.65, German 2.84, French 2.89, Spanish 2.82, Russian 3.18, Greek 3.39; with 1024 tokens Russian
# 4.09 and Greek 4.22) with headroom; spelled byte by byte, a Cyrillic or Greek word of 7 letters takes 14
MAX_TOKENS_PER_WORD = {"English": 2.9, "German": 3.1, "French": 3.1, "Spanish": 3.1, "Russian": 3.5, "Greek": 3.7}
MAX_ANSWER_TOKENS = 64  # webbuild.train.evaluate.MAX_NEW_TOKENS and the example's max_new_tokens
needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed")


def test_five_languages_and_a_non_latin_script():
    assert len(MULTILINGUAL) >= 5 and MULTILINGUAL[0] == "English"
    assert {"CYRILLIC", "GREEK"} <= {SCRIPTS[name] for name in MULTILINGUAL}
    assert set(MULTILINGUAL) == set(SCRIPTS)


@pytest.mark.parametrize("name", MULTILINGUAL)
def test_each_vocabulary_loads_in_its_own_script(name):
    lang = LANGUAGES[name]
    words = load_vocabulary(lang.vocabulary)
    assert lang.vocabulary.parent == VOCABULARY_DIR and lang.vocabulary.name == f"{lang.voice}.txt"
    assert 1000 <= len(words) <= 1600 and len(set(words)) == len(words)
    for word in words:
        assert all(c in lang.letters for c in word), word
        assert {unicodedata.name(c).split()[0] for c in word} == {SCRIPTS[name]}, word


@pytest.mark.parametrize("name", [n for n in MULTILINGUAL if n != "English"])
def test_no_english_word_in_another_vocabulary(name):
    """A spelling of the English list would be text of two languages (French 'question', German 'hand')."""
    shared = set(load_vocabulary()) & set(load_vocabulary(LANGUAGES[name].vocabulary))
    assert not shared, sorted(shared)


def test_a_vocabulary_with_a_capital_or_a_digit_is_refused(tmp_path):
    bad = tmp_path / "xx.txt"
    bad.write_text("дом\nМосква\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"xx.txt: 'Москва' is not a lower-case word"):
        load_vocabulary(bad)


@pytest.mark.parametrize("name", MULTILINGUAL)
def test_no_heldout_sentence_in_training(name):
    lang = LANGUAGES[name]
    held = language_heldout(lang)
    train = language_training(lang, 5000, seed=1)
    assert len(held) == 500 and set(held).isdisjoint(train)
    assert set(load_vocabulary(lang.vocabulary)) >= {w for s in held[:50] for w in s.split()}


def test_english_keeps_its_sentences():
    """English alone draws what the English-only recipe drew: the same held-out set and training sentences."""
    vocab = load_vocabulary()
    assert language_heldout(ENGLISH) == heldout_sentences(vocab) and ENGLISH.seed_offset == 0
    assert mixed_training((ENGLISH,), 300, seed=1) == (training_sentences(vocab, 300, 1), ["English"] * 300)
    assert mixed_heldout((ENGLISH,), 20)[0] == heldout_sentences(vocab, 20, HELDOUT_SEED)


def test_mixed_sets_hold_every_language():
    langs = tuple(LANGUAGES[n] for n in MULTILINGUAL)
    texts, names = mixed_training(langs, 1200, seed=1)
    counts = {n: names.count(n) for n in MULTILINGUAL}
    assert all(120 <= c <= 280 for c in counts.values()), counts  # uniform: 200 each
    for text, name in zip(texts, names):
        assert set(text.split()) <= set(load_vocabulary(LANGUAGES[name].vocabulary))
    held, held_names = mixed_heldout(langs, 10)
    assert held_names[:len(langs)] == list(MULTILINGUAL)  # in turn: any prefix holds each language
    assert held[len(langs) * 3 + 4] == language_heldout(LANGUAGES[MULTILINGUAL[4]], 10)[3]
    assert mixed_training(langs, 1200, seed=1) == (texts, names)  # deterministic


def test_parse_languages():
    assert [lang.name for lang in parse_languages("English, Russian")] == ["English", "Russian"]
    assert [lang.name for lang in parse_languages("all")] == list(MULTILINGUAL)
    with pytest.raises(ValueError, match="no training data for Klingon; name some of English, German"):
        parse_languages("English,Klingon")
    with pytest.raises(ValueError, match="named twice"):
        parse_languages("Greek,Greek")


@pytest.mark.parametrize("name", MULTILINGUAL)
def test_answer_names_the_language(name):
    sentence = language_heldout(LANGUAGES[name], 1)[0]
    answer = answer_text(sentence, name)
    assert answer == f"language {name}<asr_text>{sentence}<|im_end|>"
    assert parse_language(answer) == name and parse_answer(answer) == sentence


@pytest.fixture(scope="module")
def multilingual_tokenizer():
    langs = tuple(LANGUAGES[n] for n in MULTILINGUAL)
    size = tokenizer_size(langs, 1024)  # the tiny preset's (webbuild.zoo.presets: importing it needs torch)
    assert size == 2048 and tokenizer_size(langs[:1], 1024) == 1024  # English alone: the shipped tokenizer's
    return build_tokenizer(tokenizer_texts(langs), bpe_vocab_size=size)


@pytest.mark.parametrize("name", MULTILINGUAL)
def test_tokenizer_covers_every_script(multilingual_tokenizer, name):
    """Merges cover Cyrillic and Greek words (no byte blow-up), and every held-out answer fits the decode's
    budget of new tokens."""
    tok, lang = multilingual_tokenizer, LANGUAGES[name]
    held = language_heldout(lang)
    per_word = sum(len(tok.encode(s, add_special_tokens=False).ids) for s in held) / sum(len(s.split()) for s in held)
    assert per_word <= MAX_TOKENS_PER_WORD[name], per_word
    longest = max(len(tok.encode(answer_text(s, name), add_special_tokens=False).ids) for s in held)
    assert longest <= MAX_ANSWER_TOKENS, longest
    prefix = tok.encode(f"language {name}", add_special_tokens=False).ids
    assert len(prefix) <= 3, prefix  # the answer's tag: 'language' and the name learnt as tokens
    sentence = language_heldout(lang, 1)[0]
    assert tok.decode(tok.encode(answer_text(sentence, name)).ids, skip_special_tokens=False) == answer_text(
        sentence, name)


def test_an_adapter_shard_without_languages_loads_as_english(tmp_path):
    """webbuild.train.adapter_data writes shards without `languages`: they are English."""
    path = tmp_path / "general-00000.npz"
    np.savez(path, pcm=np.zeros(10, np.int16), lengths=np.array([4, 6]), texts=np.array(["a", "b"]),
             recipe=np.array("2 augmented 5"))
    assert load_shards([path]).languages == ["English", "English"]


@needs_espeak
def test_shards_record_their_languages_and_another_mix_is_made_again(tmp_path):
    texts = ["hallo welt", "guten tag"]
    (path,) = build_shards(tmp_path, texts, seed=1, workers=1)
    english = load_shards([path])
    assert english.languages == ["English", "English"] and str(np.load(path)["recipe"]).endswith(" English")
    build_shards(tmp_path, texts, seed=1, workers=1, languages=["German", "German"])
    german = load_shards([path])
    assert german.languages == ["German", "German"] and str(np.load(path)["recipe"]).endswith(" German")
    assert not np.array_equal(german.pcm, english.pcm)  # spoken again, in German's voice


@needs_espeak
def test_fresh_clips_of_a_language_are_new_sentences_of_its_vocabulary(tmp_path):
    """`python -m webbuild.train.clips --language Russian --fresh 7`: new Russian sentences (none of the held-out
    set, every word from its published list), spoken; without --fresh, English's held-out clips as always."""
    from click.testing import CliRunner

    from webbuild.reference.audio import read_wav
    from webbuild.train.clips import main

    russian = LANGUAGES["Russian"]
    run = CliRunner().invoke(main, [str(tmp_path / "ru"), "--language", "Russian", "--fresh", "7", "--count", "3"])
    assert run.exit_code == 0, run.output
    texts = [(tmp_path / "ru" / f"heldout-{i:03d}.txt").read_text().strip() for i in range(3)]
    words = set(load_vocabulary(russian.vocabulary))
    assert all(set(t.split()) <= words for t in texts) and not set(texts) & set(language_heldout(russian))
    assert all(len(read_wav(tmp_path / "ru" / f"heldout-{i:03d}.wav")) > 8000 for i in range(3))
    again = CliRunner().invoke(main, [str(tmp_path / "ru2"), "--language", "Russian", "--fresh", "8", "--count", "3"])
    assert again.exit_code == 0 and (tmp_path / "ru2" / "heldout-000.txt").read_text().strip() != texts[0]

    run = CliRunner().invoke(main, [str(tmp_path / "en"), "--count", "2"])
    assert run.exit_code == 0, run.output
    assert (tmp_path / "en" / "heldout-001.txt").read_text().strip() == heldout_sentences(load_vocabulary())[1]
    bad = CliRunner().invoke(main, [str(tmp_path / "xx"), "--language", "Klingon"])
    assert bad.exit_code == 2 and "--language" in bad.output and "Russian" in bad.output

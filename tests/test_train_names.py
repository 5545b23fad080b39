"""The rare names and their context texts the training data can carry (webbuild.train.names; no torch: a batch's
prompt with its clip's context is tests/test_train_data.py's)."""

from webbuild.train.languages import LANGUAGES, MULTILINGUAL
from webbuild.train.names import SYLLABLES, contexts, names_heldout, names_in, pseudo_name, with_names
from webbuild.train.sentences import language_heldout, load_vocabulary, mixed_training


def test_names_are_no_vocabulary_word_and_spell_in_their_languages_letters():
    import random

    rng = random.Random(0)
    for name in MULTILINGUAL:
        lang = LANGUAGES[name]
        assert name in SYLLABLES
        words = set(load_vocabulary(lang.vocabulary))
        for _ in range(200):
            n = pseudo_name(rng, lang)
            assert n not in words and set(n) <= set(lang.letters) and 4 <= len(n) <= 8


def test_a_share_of_sentences_gets_one_name_and_its_context_lists_it_among_others():
    texts, languages = mixed_training(tuple(LANGUAGES[n] for n in MULTILINGUAL), 3000, seed=1)
    assert with_names(texts, languages, 0.0, 1) == texts  # the English recipe's data, sentence for sentence
    named = with_names(texts, languages, 0.25, 1)
    assert named == with_names(texts, languages, 0.25, 1)  # seeded
    changed = [i for i, (a, b) in enumerate(zip(texts, named)) if a != b]
    assert 0.2 < len(changed) / len(texts) < 0.3
    for i in changed:
        assert len(named[i].split()) == len(texts[i].split()) and len(names_in(named[i], languages[i])) == 1
    assert not any(names_in(texts[i], languages[i]) for i in range(len(texts)))
    ctx = contexts(named, languages, 1)
    for i in changed:
        (name,) = names_in(named[i], languages[i])
        assert name in ctx[i].split(", ")
    distractors_only = [c for i, c in enumerate(ctx) if i not in set(changed) and c]
    assert 0 < len(distractors_only) < 0.2 * (len(texts) - len(changed))  # nothing to copy in those


def test_the_names_set_is_held_out_sentences_each_with_a_name():
    langs = (LANGUAGES["English"], LANGUAGES["Greek"])
    texts, languages = names_heldout(langs, 5)
    assert languages == ["English", "Greek"] * 5
    for text, language in zip(texts, languages):
        assert len(names_in(text, language)) == 1
    base = set(language_heldout(LANGUAGES["English"])[-5:])
    assert all(any(len(set(t.split()) & set(b.split())) >= len(b.split()) - 1 for b in base)
               for t, lang in zip(texts, languages) if lang == "English")


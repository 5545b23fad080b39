from webbuild.reference.wer import corpus_wer, normalize, wer


def test_normalisation_ignores_case_and_punctuation():
    assert normalize("Hello, World! It's fine.") == ["hello", "world", "it's", "fine"]
    assert wer("Hello, world.", "hello world") == 0.0


def test_edit_kinds():
    assert wer("a b c d", "a x c d") == 0.25  # substitution
    assert wer("a b c d", "a c d") == 0.25  # deletion
    assert wer("a b c d", "a b q c d") == 0.25  # insertion
    assert wer("a b", "") == 1.0


def test_corpus_wer_weights_by_words():
    assert corpus_wer([("a b c d", "a b c d"), ("e f", "x y")]) == 2 / 6

"""The training run's evaluation per language: error rate (WER, or CER for a language written without
spaces) and how often the answer names the clip's language, detected and forced."""

import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from webbuild.reference.tokenizer import build_tokenizer  # noqa: E402
from webbuild.train.batches import ClipStore, features, token_batch  # noqa: E402
from webbuild.train.dataset import Clips, synthesize_clips  # noqa: E402
from webbuild.train.evaluate import cer, format_rows, heldout_report, language_rows  # noqa: E402
from webbuild.train.languages import LANGUAGES, MULTILINGUAL  # noqa: E402
from webbuild.train.sentences import language_heldout, tokenizer_texts  # noqa: E402
from webbuild.train.train import make_model  # noqa: E402

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed")


def test_language_rows_score_each_language_and_its_tag():
    texts = ["the big dog", "a red cat", "дом стол", "καλή μέρα"]
    languages = ["English", "English", "Russian", "Greek"]
    answers = ["language English<asr_text>the big dog<|im_end|>",  # right
               "language German<asr_text>a red hat<|im_end|>",  # a word and the language wrong
               "language Russian<asr_text>дом стул<|im_end|>",  # a word wrong
               "language None<asr_text><|im_end|>"]  # nothing heard
    rows = {r.language: r for r in language_rows(texts, languages, answers)}
    assert list(rows) == ["English", "Russian", "Greek"]
    assert rows["English"].clips == 2 and rows["English"].error_rate == pytest.approx(1 / 6)
    assert rows["English"].language_right == 0.5 and rows["English"].metric == "WER"
    assert rows["Russian"].error_rate == 0.5 and rows["Russian"].language_right == 1.0
    assert rows["Greek"].error_rate == 1.0 and rows["Greek"].language_right == 0.0
    forced = language_rows(texts, languages, ["the big dog", "a red hat", "дом стул", ""], forced=True)
    assert [r.language_right for r in forced] == [1.0, 1.0, 1.0]
    assert [r.error_rate for r in forced] == [r.error_rate for r in rows.values()]
    table = format_rows(list(rows.values()), "final").splitlines()
    assert table[0] == "final" and table[3] == "| English | 2 | WER 16.67% | 50.0% |"


def test_cer_counts_characters_without_spaces():
    assert cer(["今天 天气"], ["今天天汽"]) == 0.25  # one of four characters; the space does not count
    assert cer(["abc"], [""]) == 1.0


def test_forced_eval_prompt_ends_with_the_language_prefix():
    """Forced, an eval prompt is the plain one followed by its clip's language's answer prefix; a training
    row's answer names the clip's language."""
    tok = build_tokenizer(tokenizer_texts((LANGUAGES["English"], LANGUAGES["Russian"])), 400)
    clips = Clips(np.zeros(32000, np.int16), np.array([16000, 16000]), ["a b", "дом"], ["English", "Russian"])
    store = ClipStore.build(clips, tok, "cpu")
    idx = torch.arange(2)
    _, mask = features(store, idx)
    forced, forced_att, _ = token_batch(store, idx, mask, tok, train=False, forced=True)
    plain, plain_att, _ = token_batch(store, idx, mask, tok, train=False)
    for row in range(2):
        prefix = tok.encode(f"language {clips.languages[row]}<asr_text>", add_special_tokens=False).ids
        assert forced[row][forced_att[row].bool()].tolist() == plain[row][plain_att[row].bool()].tolist() + prefix
    _, _, labels = token_batch(store, idx, mask, tok, train=True)
    answer = [t for t in labels[1].tolist() if t != -100]
    assert tok.decode(answer, skip_special_tokens=False) == "language Russian<asr_text>дом<|im_end|>"


@pytest.fixture
def one_thread():
    """One torch thread: on a shared 2-core box two spinning threads made this test 6 minutes."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@needs_espeak
def test_heldout_report_has_a_row_per_language(one_thread):
    """A random tiny model over one held-out clip of each language: a row each, and forced, the tag
    right on every clip by construction (a few tokens of answer suffice)."""
    langs = tuple(LANGUAGES[n] for n in MULTILINGUAL)
    tok = build_tokenizer(tokenizer_texts(langs), 1024)
    texts = [language_heldout(lang, 1)[0] for lang in langs]
    clips = synthesize_clips(texts, seed=3, languages=list(MULTILINGUAL))
    store = ClipStore.build(clips, tok, "cpu")
    torch.manual_seed(0)
    model = make_model(tok).eval()
    rows, hyps = heldout_report(model, tok, store, max_new_tokens=4)
    assert [r.language for r in rows] == list(MULTILINGUAL) and len(hyps) == len(texts)
    assert all(r.clips == 1 and r.metric == "WER" and r.error_rate > 0 for r in rows)
    forced, _ = heldout_report(model, tok, store, forced=True, max_new_tokens=4)
    assert [r.language_right for r in forced] == [1.0] * len(langs)

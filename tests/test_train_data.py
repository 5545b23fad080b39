"""Training data: espeak-ng synthesis, sentence split, tokenizer round trip, GPU mel twin."""

import shutil

import numpy as np
import pytest
import torch

from webbuild.reference.mel import log_mel
from webbuild.reference.prompt import answer_text, parse_answer
from webbuild.reference.tokenizer import build_tokenizer
from webbuild.train.dataset import synthesize_clips
from webbuild.train.features import log_mel_batch
from webbuild.train.sentences import heldout_sentences, load_vocabulary, training_sentences
from webbuild.train.speech import SAMPLE_RATE, Style, synthesize

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed")


def test_vocabulary_is_clean():
    vocab = load_vocabulary()
    assert len(vocab) >= 1000 and len(set(vocab)) == len(vocab)
    # one spelling per pronunciation among the classic homophone pairs
    for pair in [("to", "two"), ("their", "there"), ("know", "no"), ("right", "write"), ("for", "four"),
                 ("sea", "see"), ("hear", "here"), ("by", "buy"), ("one", "won"), ("new", "knew")]:
        assert sum(w in vocab for w in pair) <= 1, pair


def test_heldout_never_in_training():
    vocab = load_vocabulary()
    held = set(heldout_sentences(vocab))
    train = training_sentences(vocab, 5000, seed=3)
    assert len(held) == 500 and held.isdisjoint(train)
    assert training_sentences(vocab, 50, seed=3) == train[:50]  # deterministic
    assert all(3 <= len(s.split()) <= 12 for s in train)


@needs_espeak
def test_synthesized_clip_is_16k_mono_float32():
    rng = np.random.default_rng(0)
    style = Style("en-us+f2", rate=160, pitch=50, gain_db=0.0, snr_db=30.0, lead_s=0.2, trail_s=0.2)
    pcm = synthesize("the big dog runs home", style, rng)
    assert pcm.dtype == np.float32 and pcm.ndim == 1
    seconds = len(pcm) / SAMPLE_RATE
    assert 1.0 < seconds < 4.0, seconds
    assert 0.05 < np.abs(pcm).max() <= 1.0
    head = pcm[: int(0.15 * SAMPLE_RATE)]  # leading silence holds only the low noise floor
    assert np.sqrt(np.mean(head**2)) < 0.1 * np.sqrt(np.mean(pcm**2))


def test_tokenizer_round_trip():
    vocab = load_vocabulary()
    tok = build_tokenizer(training_sentences(vocab, 2000, seed=0), bpe_vocab_size=1024)
    sentence = heldout_sentences(vocab, 1)[0]
    ids = tok.encode(answer_text(sentence), add_special_tokens=False).ids
    assert tok.token_to_id("<asr_text>") in ids
    assert parse_answer(tok.decode(ids, skip_special_tokens=False)) == sentence


@needs_espeak
def test_torch_mel_twin_matches_reference():
    clips = synthesize_clips(["hello there", "a much longer sentence with several more words in it"], seed=5)
    pcm = torch.as_tensor(clips.pcm)
    feats, mask = log_mel_batch(pcm, torch.as_tensor(clips.offsets), torch.as_tensor(clips.lengths), 1 / 32767.0)
    assert feats.shape[2] % 100 == 0 and feats.shape[2] == mask.shape[1]
    for i in range(2):
        ref = log_mel(clips.clip(i))
        frames = ref.shape[1]
        assert int(mask[i].sum()) == frames
        assert np.abs(feats[i, :, :frames].numpy() - ref).max() < 1e-4
        assert not feats[i, :, frames:].any()

"""Training data: espeak-ng synthesis, sentence split, tokenizer round trip, GPU mel twin."""

import dataclasses
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from webbuild.reference.mel import lead_length, lead_samples, log_mel  # noqa: E402
from webbuild.reference.prompt import answer_text, build_prompt, parse_answer, prefix_ids  # noqa: E402
from webbuild.reference.tokenizer import build_tokenizer  # noqa: E402
from webbuild.train.batches import ClipStore, token_batch  # noqa: E402
from webbuild.train.dataset import Clips, synthesize_clips  # noqa: E402
from webbuild.train.features import log_mel_batch  # noqa: E402
from webbuild.train.sentences import heldout_sentences, load_vocabulary, training_sentences  # noqa: E402
from webbuild.train.speech import (  # noqa: E402
    CUT_S,
    DIGITAL_SILENCE_SHARE,
    ONSET_SHARE,
    SAMPLE_RATE,
    SILENCE_S,
    TAIL_CUT_S,
    TAIL_CUT_SHARE,
    VARIANTS,
    VOICES,
    Style,
    random_style,
    synthesize,
)

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
@pytest.mark.parametrize("lead_ms", [0, 100, 300])
def test_torch_mel_twin_matches_reference(lead_ms):
    """Per clip, with and without the front-end's lead (training mixes both in one batch), on clips
    that start with a pause (the lead tops it up) and with speech (the whole lead)."""
    clips = synthesize_clips(["hello there", "a much longer sentence with several more words in it"], seed=5)
    onset = clips.clip(1)[int(np.argmax(np.abs(clips.clip(1)) > 0.05)):]  # the pause cut off
    pcm16 = np.concatenate([clips.pcm, np.round(onset * 32767).astype(np.int16)])
    lengths = np.append(clips.lengths, len(onset))
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    leads = [lead_samples(lead_ms), 0, lead_samples(lead_ms)]
    feats, mask = log_mel_batch(torch.as_tensor(pcm16), torch.as_tensor(offsets), torch.as_tensor(lengths),
                                1 / 32767.0, torch.tensor(leads))
    assert feats.shape[2] % 100 == 0 and feats.shape[2] == mask.shape[1]
    for i in range(3):
        clip = pcm16[offsets[i]:offsets[i] + lengths[i]].astype(np.float32) / 32767.0
        ref = log_mel(clip, leads[i])
        frames = ref.shape[1]
        assert int(mask[i].sum()) == frames
        assert np.abs(feats[i, :, :frames].numpy() - ref).max() < 1e-4
        assert not feats[i, :, frames:].any()
    if lead_ms:  # speech at the first sample gets more lead than a clip that starts with a pause
        assert lead_length(onset, leads[2]) > lead_length(clips.clip(0), leads[0])


def first_sound(clips: Clips) -> np.ndarray:
    """Per clip, the first sample above 5x the RMS of its last 50 ms (trailing silence: the noise
    alone). White noise passes 5 sigma once in ~2 million samples; speech at 20-40 dB SNR at once."""
    firsts = []
    for i in range(len(clips.texts)):
        pcm = clips.clip(i)
        noise = np.sqrt(np.mean(pcm[-SAMPLE_RATE // 20:] ** 2))
        firsts.append(int(np.argmax(np.abs(pcm) > 5 * noise)))
    return np.array(firsts)


@pytest.fixture(scope="module")
def augmented() -> Clips:
    return synthesize_clips(training_sentences(load_vocabulary(), 80, seed=4), seed=11, augment=True)


@needs_espeak
def test_a_share_of_training_clips_starts_with_speech(augmented):
    """Issue 17: about ONSET_SHARE of training clips have speech from their first samples (espeak-ng's
    own leading silence trimmed), the rest at least SILENCE_S[0] of silence first; held-out clips
    (no augmentation) all start with silence."""
    pause = int(SILENCE_S[0] * SAMPLE_RATE)
    train = first_sound(augmented)
    share = float(np.mean(train < pause))
    assert abs(share - ONSET_SHARE) <= 0.15, share  # about 3 standard deviations of 80 draws
    assert np.sum(train < 80) >= 0.6 * np.sum(train < pause)  # most within 5 ms, not after a short pause
    held = first_sound(synthesize_clips(augmented.texts[:20], seed=11))
    assert held.min() >= pause, held.min()


@needs_espeak
def test_a_share_of_training_clips_has_digital_silence(augmented):
    """About DIGITAL_SILENCE_SHARE of training clips end in exact zeros (noise over the speech only)."""
    def silent_end(clips):
        return np.array([not clips.clip(i)[-SAMPLE_RATE // 20:].any() for i in range(len(clips.texts))])

    assert abs(float(np.mean(silent_end(augmented))) - DIGITAL_SILENCE_SHARE) <= 0.1
    assert not silent_end(synthesize_clips(augmented.texts[:20], seed=11)).any()


def test_onset_share_zero_draws_the_styles_of_before():
    """The held-out clips keep their voices, rates and noise: share 0 draws what the sampler drew
    before the onset share existed (written out here), and no extra number."""
    def before(rng):
        return Style(str(rng.choice(VOICES)) + str(rng.choice(VARIANTS)), int(rng.integers(130, 191)),
                     int(rng.integers(30, 71)), float(rng.uniform(-6.0, 3.0)), float(rng.uniform(20.0, 40.0)),
                     float(rng.uniform(0.05, 0.4)), float(rng.uniform(0.05, 0.4)))

    a, b = np.random.default_rng(9), np.random.default_rng(9)
    assert [random_style(a) for _ in range(50)] == [before(b) for _ in range(50)]
    assert a.random() == b.random()
    leads = np.array([random_style(a, augment=True).lead_s for _ in range(200)])
    assert leads.min() >= -CUT_S and 0.2 <= np.mean(leads <= 0) <= 0.5


@needs_espeak
def test_cut_into_the_speech():
    """A negative lead cuts that much off the speech's start: same clip, shorter by the cut."""
    style = Style("en-us", rate=160, pitch=50, gain_db=0.0, snr_db=40.0, lead_s=0.0, trail_s=0.1)
    whole = synthesize("brain", style, np.random.default_rng(0))
    cut = synthesize("brain", dataclasses.replace(style, lead_s=-0.005), np.random.default_rng(0))
    assert len(whole) - len(cut) == 80
    assert np.abs(whole[:80]).max() > 0.01  # speech from the first sample: espeak-ng's silence is gone


def test_a_share_of_training_styles_ends_as_speech_detection_cuts():
    """About TAIL_CUT_SHARE of the augmented styles trim espeak-ng's trailing silence and keep 0 to TAIL_CUT_S of
    it; the others keep a pause of SILENCE_S after it."""
    rng = np.random.default_rng(3)
    styles = [random_style(rng, augment=True) for _ in range(600)]
    cut = [s for s in styles if s.trim_tail]
    assert abs(len(cut) / len(styles) - TAIL_CUT_SHARE) <= 0.07
    assert all(0.0 <= s.trail_s <= TAIL_CUT_S for s in cut)
    assert all(SILENCE_S[0] <= s.trail_s <= SILENCE_S[1] for s in styles if not s.trim_tail)


@needs_espeak
def test_a_trimmed_tail_ends_the_clip_at_the_speech():
    """trim_tail with no trail: the clip's last 10 ms are speech; without it espeak-ng's own silence ends it."""
    style = Style("en-us", rate=160, pitch=50, gain_db=0.0, snr_db=90.0, lead_s=0.1, trail_s=0.0)
    whole = synthesize("brain", style, np.random.default_rng(0))
    cut = synthesize("brain", dataclasses.replace(style, trim_tail=True), np.random.default_rng(0))
    assert len(cut) < len(whole)
    tail = SAMPLE_RATE // 100
    assert np.abs(cut[-tail:]).max() > 0.01 * np.abs(cut).max() > np.abs(whole[-tail:]).max()


def test_a_batch_prompt_carries_its_clips_context():
    tok = build_tokenizer(["harmony emerge surprise", "language English"] * 50, 300)
    clips = Clips(np.zeros(32000, np.int16), np.array([16000, 16000]), ["harmony kavo", "emerge"],
                  ["English", "English"])
    store = ClipStore.build(clips, tok, "cpu", ["kavo, lime", ""])
    mask = torch.ones((2, 100), dtype=torch.long)
    ids, _, labels = token_batch(store, torch.arange(2), mask, tok, train=True)
    with_context = build_prompt(tok, 13, context="kavo, lime").ids
    assert ids[0, :len(with_context)].tolist() == with_context
    assert ids[1, :len(prefix_ids(tok))].tolist() == prefix_ids(tok)
    assert (labels[0, :len(with_context)] == -100).all()
    ids_plain, _, _ = token_batch(store.without_contexts(), torch.arange(2), mask, tok, train=True)
    assert ids_plain[0, :len(prefix_ids(tok))].tolist() == prefix_ids(tok)


def test_a_name_share_outside_0_to_1_is_one_line_and_exit_2(tmp_path):
    from click.testing import CliRunner

    from webbuild.train.train import main

    run = CliRunner().invoke(main, ["--out", str(tmp_path / "ckpt"), "--name-share", "1.5"])
    assert run.exit_code == 2 and "--name-share" in run.output and not (tmp_path / "ckpt").exists()

"""The batched training forward matches the upstream Qwen3-ASR forward (tiny preset, CPU)."""

import pytest

torch = pytest.importorskip("torch")

pytest.importorskip("transformers")

from webbuild.reference.prompt import audio_token_count, build_prompt  # noqa: E402
from webbuild.reference.tokenizer import build_tokenizer  # noqa: E402
from webbuild.train.fastpath import logits_and_loss  # noqa: E402
from webbuild.train.sentences import load_vocabulary, training_sentences  # noqa: E402
from webbuild.train.train import make_model  # noqa: E402


def test_fastpath_matches_upstream():
    torch.manual_seed(0)
    tok = build_tokenizer(training_sentences(load_vocabulary()[:200], 500, seed=0), 400)
    model = make_model(tok).eval()
    frames = [830, 240, 117]  # > one 8 s window, a partial chunk, a 17-frame tail
    t_pad = 900
    feats = torch.randn(len(frames), 128, t_pad)
    mask = (torch.arange(t_pad)[None] < torch.tensor(frames)[:, None]).long()
    rows = [build_prompt(tok, audio_token_count(f)).ids + [5, 6, 7] for f in frames]
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    att = torch.zeros_like(ids)
    for r, row in enumerate(rows):
        ids[r, : len(row)], att[r, : len(row)] = torch.tensor(row), 1
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=att, input_features=feats, input_features_mask=mask).logits
        ours, _ = logits_and_loss(model, ids, att, feats, mask)
    real = att.bool()
    assert torch.allclose(ours[real], ref[real], atol=1e-4), (ours[real] - ref[real]).abs().max()


def test_warm_start_takes_every_weight_that_fits_and_leaves_the_vocabulary_sized_ones(tmp_path):
    from click import UsageError

    from webbuild.train.train import warm_start

    words = load_vocabulary()[:200]
    source = make_model(build_tokenizer(training_sentences(words, 500, seed=0), 400))
    source.save_pretrained(tmp_path / "source")
    model = make_model(build_tokenizer(training_sentences(words, 500, seed=1), 300))  # another vocabulary
    fresh = warm_start(model, tmp_path / "source")
    assert fresh == ["lm_head.weight", "model.language_model.embed_tokens.weight"]
    ours, theirs = model.state_dict(), source.state_dict()
    assert all(torch.equal(ours[name], theirs[name]) for name in ours if name not in fresh)
    assert not torch.equal(ours[fresh[1]][:10], theirs[fresh[1]][:10])
    other = torch.nn.Linear(3, 3)  # nothing of the checkpoint fits: one line, not a silent fresh start
    with pytest.raises(UsageError, match="no weight of that checkpoint fits this model"):
        warm_start(other, tmp_path / "source")
    # the same number of tokens but other ids (another tokenizer's): the rows would mean other tokens
    tok, other_tok = (build_tokenizer(training_sentences(words, 500, seed=s), 400) for s in (0, 2))
    tok.save(str(tmp_path / "source" / "tokenizer.json"))
    assert other_tok.get_vocab_size() == tok.get_vocab_size() and other_tok.get_vocab() != tok.get_vocab()
    assert warm_start(make_model(other_tok), tmp_path / "source", other_tok) == fresh
    assert warm_start(make_model(tok), tmp_path / "source", tok) == []  # the same ids: all of it carries over
    (tmp_path / "empty").mkdir()  # a folder with no checkpoint (an export not rebuilt, say): one line
    with pytest.raises(UsageError, match="not a checkpoint folder .*webbuild.train.from_export"):
        warm_start(model, tmp_path / "empty")

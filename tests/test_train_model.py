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

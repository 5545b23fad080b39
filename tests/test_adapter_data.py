"""An adapter run's clips: made once over processes, the same for any number of them, held-out sets
equal to the ones `adapt evaluate` measures on, never a training sentence; batches and the WER table."""

import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from webbuild.train import adapter_data  # noqa: E402
from webbuild.train.adapter_data import Plan  # noqa: E402
from webbuild.train.sentences import heldout_sentences, load_vocabulary  # noqa: E402
from webbuild.train.target import heldout_target  # noqa: E402

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed")
PLAN = Plan("klatt", clips=3, general=2, count=2)


def _same(a, b):
    return a.texts == b.texts and np.array_equal(a.lengths, b.lengths) and np.array_equal(a.pcm, b.pcm)


@needs_espeak
def test_data_folder(tmp_path, monkeypatch):
    from webbuild.train.adapt import general_heldout

    monkeypatch.setattr(adapter_data, "SHARD_CLIPS", 2)  # several shards per part from a few clips
    one = adapter_data.load(adapter_data.build(tmp_path / "one", PLAN, workers=1))
    two = adapter_data.load(adapter_data.build(tmp_path / "two", PLAN, workers=2))
    assert _same(one.train, two.train) and all(_same(one.sets[k], two.sets[k]) for k in one.sets)
    assert len(one.train.texts) == 5 and len(set(one.train.texts)) == 5
    assert not set(one.train.texts) & set(heldout_sentences(load_vocabulary()))
    # the held-out sets are the ones `adapt evaluate` and `survey` synthesize themselves
    assert _same(one.sets["klatt held-out"], heldout_target("klatt", 2))
    assert _same(one.sets["general held-out"], general_heldout(2))
    # a second build keeps the shards; a held-out-only load reads no training clip
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "one").glob("*.npz")}
    adapter_data.build(tmp_path / "one", PLAN, workers=1)
    assert before == {p: p.stat().st_mtime_ns for p in (tmp_path / "one").glob("*.npz")}
    assert adapter_data.load(tmp_path / "one", training=False).train is None


@needs_espeak
def test_general_clips_speak_the_bases_languages(tmp_path):
    """On a multilingual base the general clips, training and held-out, speak its languages (the target stays
    English); the plan, languages included, is read back from the folder."""
    from webbuild.train.adapt import general_heldout

    plan = Plan("klatt", clips=1, general=6, count=2, languages=("German", "Greek"))
    data = adapter_data.load(adapter_data.build(tmp_path / "de-el", plan, workers=1))
    assert data.plan == plan
    assert data.train.languages[0] == "English" and set(data.train.languages[1:]) == {"German", "Greek"}
    held = data.sets["general held-out"]
    assert held.languages == ["German", "Greek"] and _same(held, general_heldout(2, ("German", "Greek")))
    assert not set(data.train.texts) & set(held.texts)


def test_batches_take_the_general_share():
    from webbuild.train.adapt import batch_indices

    gen = torch.Generator().manual_seed(0)
    idx = batch_indices(gen, n_target=100, n_total=300, batch_size=32, general_share=0.75)
    assert (idx >= 100).sum() == 24 and (idx < 100).sum() == 8 and idx.max() < 300
    idx = batch_indices(gen, 100, 300, 1000, None)
    assert idx.min() >= 0 and idx.max() < 300 and (idx < 100).sum() > 200


def test_wer_table_marks_the_bound():
    from webbuild.train.adapt import markdown_table

    def log(general, steps_run=100):
        return dict(target="klatt", clips=10, general_clips=10, eval_clips=5, lead_ms=300, device="cpu",
                    hardware="x", steps=100, steps_run=steps_run,
                    wer_base={"klatt held-out": 0.7, "general held-out": 0.036},
                    wer_adapter={"klatt held-out": 0.2, "general held-out": general},
                    wer_scaled={"0.5": {"klatt held-out": 0.4, "general held-out": 0.04}})
    table = markdown_table([("a", "--lr 5e-4", log(0.04)), ("b", "", log(0.06, 80)), ("c", "--x", None)])
    rows = table.splitlines()
    assert rows[2].startswith("| base |  |  | 70.00% | 3.60% |")
    assert "| a | `--lr 5e-4` | 100 | 20.00% | 4.00% | +0.40 | 40.00% / 4.00% |" in table
    assert "| 80 of 100 |" in rows[4] and "+2.40 (over)" in rows[4]
    assert "| c | `--x` | failed |" in table

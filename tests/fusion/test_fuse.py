"""End to end: every zoo source fuses to the target graph, matches the source on onnxruntime CPU,
is no bigger per layer than the onnxruntime-genai builder's graph, and fusing again is a no-op."""

import numpy as np
import onnx_ir as ir
import pytest

from webbuild.fusion import parity
from webbuild.fusion.fuse_decoder import fuse_decoder
from webbuild.fusion.validate import check, check_file
from webbuild.graph.ir import census, nodes_per_layer
from webbuild.site.contract import IO


def _export_dir(path):
    return path if path.is_dir() else path.parent


def test_target_ops_and_interface(fused):
    layout, exporter, path, model, report, out = fused
    ops = report["ops_after"]
    assert ops["GroupQueryAttention"] == 4
    assert ops["SkipSimplifiedLayerNormalization"] == 8 and ops["SimplifiedLayerNormalization"] == 9
    assert not {"Softmax", "Pow", "ReduceMean", "Sqrt", "Cos", "Sin", "Expand"} & set(ops)
    assert report["not_fused"] == []
    inputs, outputs = IO.decoder(4)
    assert [v.name for v in model.graph.inputs] == inputs
    assert [v.name for v in model.graph.outputs] == outputs
    check_file(out)


def test_parity_prefill_and_decode(fused):
    layout, exporter, path, model, report, out = fused
    src = _export_dir(path)
    for seed in (0, 1):
        r = parity.compare(parity.source_runner(src), parity.MergedRunner(out), parity.embed_table(src),
                           prefill=10, steps=5, seed=seed)
        assert r["max_rel_err"] < 1e-4, r
        assert r["tokens_equal"], r


def test_logits_are_last_position_only(fused):
    *_, out = fused
    sess = check(ir.load(out))
    feeds = {"inputs_embeds": np.zeros((2, 7, 256), np.float32), "attention_mask": np.ones((2, 7), np.int64)}
    feeds.update({i.name: np.zeros((2, 2, 0, 64), np.float32) for i in sess.get_inputs()[2:]})
    logits, key0 = sess.run(["logits", "present.0.key"], feeds)
    assert logits.shape == (2, 1, 706) and key0.shape == (2, 2, 7, 64)


def test_fusing_twice_changes_nothing(fused):
    *_, out = fused
    once = ir.load(out)
    before = census(once)
    again, report = fuse_decoder(once)
    assert census(again) == before
    assert report["fused"] == {} and report["not_fused"] == []


@pytest.fixture(scope="session")
def genai_graph(genai_build):
    return genai_build("cpu")


def test_no_more_nodes_per_layer_than_genai_builder(fused, genai_graph):
    *_, model, report, out = fused
    ours, theirs = nodes_per_layer(model), nodes_per_layer(ir.load(genai_graph))
    assert ours is not None and ours <= theirs, (ours, theirs)
    non_const = {k: v for k, v in census(ir.load(genai_graph)).items() if k != "Constant"}
    assert report["nodes_after"] <= sum(non_const.values())


def test_matches_genai_builder_numerically(fused, genai_graph, zoo):
    """Same weights, independent fusion: the builder's graph and ours decode alike."""
    layout, exporter, path, model, report, out = fused
    r = parity.compare(parity.MergedRunner(genai_graph, kv_dims=(2, 64)), parity.MergedRunner(out),
                       parity.embed_table(_export_dir(path)))
    assert r["max_rel_err"] < 1e-4 and r["tokens_equal"], r


def test_genai_builder_graph_is_left_unchanged(genai_graph):
    m = ir.load(genai_graph)
    before = census(m)
    fused_again, report = fuse_decoder(m)
    assert census(fused_again) == before and report["fused"] == {}


def test_batch_rows_decode_independently(fused):
    """Two sequences in one batch give the same logits and KV as each run alone (GQA's seqlens_k)."""
    *_, out = fused
    sess = check(ir.load(out))
    rng = np.random.default_rng(3)
    embeds = rng.standard_normal((2, 6, 256)).astype(np.float32)

    def run(x):
        feeds = {"inputs_embeds": x, "attention_mask": np.ones(x.shape[:2], np.int64)}
        feeds.update({i.name: np.zeros((x.shape[0], 2, 0, 64), np.float32) for i in sess.get_inputs()[2:]})
        return sess.run(["logits", "present.3.value"], feeds)

    both = run(embeds)
    for row in range(2):
        alone = run(embeds[row:row + 1])
        for a, b in zip(alone, both):
            np.testing.assert_allclose(b[row:row + 1], a, rtol=1e-4, atol=1e-5)

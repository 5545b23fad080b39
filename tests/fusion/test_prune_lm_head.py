import numpy as np

from tests.fusion.partial import partly_fused
from webbuild.fusion import prune_lm_head
from webbuild.fusion.validate import check


def test_logits_only_for_last_position(zoo):
    m, report = partly_fused(zoo.source("merged", "torchscript"), [])
    sess_before = check(m)
    assert prune_lm_head.rule().apply(m, report) == 1
    assert list(m.graph.outputs[0].shape)[1] == 1
    sess = check(m)
    rng = np.random.default_rng(0)
    feeds = {"inputs_embeds": rng.standard_normal((1, 6, 256)).astype(np.float32),
             "attention_mask": np.ones((1, 6), np.int64)}
    feeds.update({i.name: np.zeros((1, 2, 0, 64), np.float32) for i in sess.get_inputs()[2:]})
    full = sess_before.run(["logits"], feeds)[0]
    last = sess.run(["logits"], feeds)[0]
    assert full.shape == (1, 6, 706) and last.shape == (1, 1, 706)
    np.testing.assert_allclose(last[:, 0], full[:, -1], rtol=1e-5, atol=1e-5)


def test_second_application_is_a_no_op(zoo):
    m, report = partly_fused(zoo.source("merged", "dynamo"), [prune_lm_head.rule().apply])
    n = len(m.graph)
    assert prune_lm_head.rule().apply(m, report) == 0 and len(m.graph) == n


def test_missing_logits_is_reported(zoo):
    m, report = partly_fused(zoo.source("merged", "torchscript"), [])
    assert prune_lm_head.rule(output="no_such_output").apply(m, report) == 0
    assert report.missed[0]["rule"] == "prune_lm_head"

import numpy as np

from tests.fusion.partial import partly_fused
from webbuild.fusion import gqa, packed_qkv, rms_norm, skip_rms_norm
from webbuild.fusion.validate import check
from webbuild.graph.ir import census

PRE = [rms_norm.RULE.apply, skip_rms_norm.RULE.apply, gqa.rule(2048).apply]


def _feeds(sess, s=5):
    rng = np.random.default_rng(0)
    feeds = {"inputs_embeds": rng.standard_normal((1, s, 256)).astype(np.float32),
             "attention_mask": np.ones((1, s), np.int64)}
    feeds.update({i.name: np.zeros((1, 2, 0, 64), np.float32) for i in sess.get_inputs()[2:]})
    return feeds


def test_three_projections_become_one_matmul_and_split(zoo):
    m, report = partly_fused(zoo.source("merged", "dynamo"), PRE)
    before = census(m)
    sess = check(m)
    want = sess.run(None, _feeds(sess))
    assert packed_qkv.RULE.apply(m, report) == 4
    from webbuild.graph.ir import dead_code_elimination
    dead_code_elimination(m)
    after = census(m)
    assert after["MatMul"] == before["MatMul"] - 8 and after["Split"] == 4
    mm = next(n for n in m.graph if n.op_type == "MatMul")
    assert mm.inputs[1].const_value.shape[1] == 256 + 128 + 128
    got = check(m).run(None, _feeds(sess))
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_packed_graph_is_not_packed_again(zoo):
    m, report = partly_fused(zoo.source("merged", "torchscript"), PRE + [packed_qkv.RULE.apply])
    assert packed_qkv.RULE.apply(m, report) == 0
    assert not report.missed

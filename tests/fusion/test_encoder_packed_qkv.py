import numpy as np
import pytest

from tests.fusion.encoder_graphs import H, apply_rules, attention_graph, window_mask
from tests.fusion.graphs import run
from webbuild.fusion import encoder_attention, encoder_packed_qkv
from webbuild.fusion.validate import check
from webbuild.graph.ir import census

S = 37


def _feeds(layout: str, cross: bool = False) -> dict:
    rng = np.random.default_rng(5)
    shape = (2, S, H) if layout == "batch" else (S, H)
    xs = {n: rng.standard_normal(shape).astype(np.float32) for n in ("x", "kv_in")[: 1 + cross]}
    return {**xs, "mask": window_mask(S, 13)}


@pytest.mark.parametrize("layout, projection", [("batch", "MatMul"), ("nobatch", "Gemm")])
def test_projections_pack_into_one_with_a_split(layout, projection):
    m = attention_graph(layout)
    feeds = _feeds(layout)
    want = run(m, feeds)[0]
    counts, report = apply_rules(m, encoder_attention.RULE.apply, encoder_packed_qkv.RULE.apply)
    assert counts == [1, 1] and not report.missed
    ops = census(m)
    assert ops[projection] == 1 and ops["Split"] == 1 and ops["MultiHeadAttention"] == 1
    assert ops.get("Unsqueeze", 0) == 1 + (layout == "nobatch")  # attention_bias [+ the packed QKV]
    split = next(n for n in m.graph if n.op_type == "Split")
    assert split.inputs[1].const_value.numpy().tolist() == [H, H, H]
    check(m)
    np.testing.assert_allclose(run(m, feeds)[0], want, rtol=1e-5, atol=1e-5)


def test_cross_attention_is_left_and_reported():
    m = attention_graph("batch", cross=True)
    feeds = _feeds("batch", cross=True)
    want = run(m, feeds)[0]
    counts, report = apply_rules(m, encoder_attention.RULE.apply, encoder_packed_qkv.RULE.apply)
    assert counts == [1, 0] and "different tensors" in report.missed[0]["why"]
    assert census(m)["MatMul"] == 3
    np.testing.assert_allclose(run(m, feeds)[0], want, rtol=1e-5, atol=1e-5)

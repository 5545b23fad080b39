import numpy as np
import pytest

from tests.fusion.encoder_graphs import H, apply_rules, attention_graph, window_mask
from tests.fusion.graphs import run
from webbuild.fusion import encoder_attention
from webbuild.fusion.validate import check
from webbuild.graph.ir import census

S = 37  # > 32 tokens, two windows: the mask matters


def _feeds(layout: str, mask: bool) -> dict:
    x = np.random.default_rng(4).standard_normal((2, S, H) if layout == "batch" else (S, H)).astype(np.float32)
    return {"x": x, **({"mask": window_mask(S, 13)} if mask else {})}


@pytest.mark.parametrize("layout", ["batch", "nobatch"])
@pytest.mark.parametrize("mask", [True, False])
@pytest.mark.parametrize("scale_on", ["scores", "q"])
def test_attention_becomes_multi_head_attention(layout, mask, scale_on):
    m = attention_graph(layout, heads=2, mask=mask, scale_on=scale_on)
    feeds = _feeds(layout, mask)
    want = run(m, feeds)[0]
    (n,), report = apply_rules(m, encoder_attention.RULE.apply)
    assert n == 1 and not report.missed
    ops = census(m)
    assert ops["MultiHeadAttention"] == 1 and not {"Softmax", "Transpose"} & set(ops)
    mha = next(node for node in m.graph if node.op_type == "MultiHeadAttention")
    assert mha.attributes["num_heads"].value == 2
    assert mha.attributes["scale"].value == pytest.approx(1 / np.sqrt(H // 2))
    # [S, H] inputs gain a batch axis for the op and lose it after; the mask becomes [1, 1, S, T]
    assert ops.get("Unsqueeze", 0) == (3 if layout == "nobatch" else 0) + mask
    assert ops.get("Squeeze", 0) == (layout == "nobatch")
    check(m)
    np.testing.assert_allclose(run(m, feeds)[0], want, rtol=1e-5, atol=1e-5)


def test_head_size_computed_at_run_time_is_left_unchecked():
    """The head split's target is Concat(constant, a piece computed at run time): the head count is
    known, the head size not, so the width check skips it rather than comparing None."""
    m = attention_graph("batch", heads=2, mask=False, runtime_hd=True)
    feeds = {**_feeds("batch", False), "hd": np.array([H // 2], np.int64)}
    want = run(m, feeds)[0]
    (n,), report = apply_rules(m, encoder_attention.RULE.apply)
    assert n == 1 and not report.missed
    check(m)
    np.testing.assert_allclose(run(m, feeds)[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs, why", [({"scale_on": "v"}, "V is scaled"),
                                         ({"softmax_axis": 1}, "last axis")])
def test_unrecognised_attention_is_left_and_reported(kwargs, why):
    m = attention_graph("batch", **kwargs)
    before = census(m)
    (n,), report = apply_rules(m, encoder_attention.RULE.apply)
    assert n == 0 and census(m) == before
    assert why in report.missed[0]["why"]
    check(m)

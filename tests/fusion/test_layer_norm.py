import numpy as np
import pytest

from tests.fusion.encoder_graphs import H, apply_rules, layer_norm_graph
from tests.fusion.graphs import run
from webbuild.fusion import layer_norm
from webbuild.fusion.validate import check
from webbuild.graph.ir import census

X = (np.random.default_rng(2).standard_normal((2, 5, H)) * 4 + 1).astype(np.float32)


@pytest.mark.parametrize("square", ["pow", "mul"])
@pytest.mark.parametrize("divide", ["div", "recip"])
@pytest.mark.parametrize("affine", [True, False])
def test_each_spelling_becomes_layer_normalization(square, divide, affine):
    m = layer_norm_graph(square, divide, affine)
    want = run(m, {"x": X})[0]
    (n,), report = apply_rules(m, layer_norm.RULE.apply)
    assert n == 1 and not report.missed
    assert census(m) == {"LayerNormalization": 1, **({} if affine else {"Identity": 1})}
    node = next(n for n in m.graph if n.op_type == "LayerNormalization")
    assert node.attributes["stash_type"].value == 1 and node.attributes["epsilon"].value == pytest.approx(1e-5)
    check(m)
    np.testing.assert_allclose(run(m, {"x": X})[0], want, rtol=1e-5, atol=1e-5)


def test_normalisation_over_another_axis_is_left_and_reported():
    m = layer_norm_graph(axis=1)
    before = census(m)
    (n,), report = apply_rules(m, layer_norm.RULE.apply)
    assert n == 0 and census(m) == before
    assert "last axis" in report.missed[0]["why"]


def test_opset_without_layer_normalization_is_left_and_reported():
    m = layer_norm_graph(opset=16)
    before = census(m)
    (n,), report = apply_rules(m, layer_norm.RULE.apply)
    assert n == 0 and census(m) == before
    assert "opset 16" in report.missed[0]["why"]
    check(m)

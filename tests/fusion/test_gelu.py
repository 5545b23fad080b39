import numpy as np
import pytest

from tests.fusion.encoder_graphs import H, apply_rules, gelu_graph
from tests.fusion.graphs import run
from webbuild.fusion import bias_gelu, gelu
from webbuild.fusion.validate import check
from webbuild.graph.ir import census

X = np.random.default_rng(1).standard_normal((5, H)).astype(np.float32) * 3


@pytest.mark.parametrize("order", ["x_first", "half_first", "x_half"])
@pytest.mark.parametrize("inner", ["div", "mul"])
def test_each_spelling_becomes_one_gelu_with_same_output(order, inner):
    m = gelu_graph(order, inner)
    want = run(m, {"x": X})[0]
    (n,), report = apply_rules(m, gelu.RULE.apply)
    assert n == 1 and census(m) == {"Gelu": 1} and not report.missed
    check(m)
    np.testing.assert_allclose(run(m, {"x": X})[0], want, rtol=1e-5, atol=1e-6)


def test_other_constant_is_left_and_reported():
    m = gelu_graph("x_first", half=0.6)
    before = census(m)
    (n,), report = apply_rules(m, gelu.RULE.apply)
    assert n == 0 and census(m) == before
    assert "0.5 * x" in report.missed[0]["why"]


@pytest.mark.parametrize("bias", ["add", "gemm"])
def test_linear_bias_moves_into_bias_gelu(bias):
    m = gelu_graph("half_first", bias=bias)
    want = run(m, {"a": X})[0]
    (g, b), report = apply_rules(m, gelu.RULE.apply, bias_gelu.RULE.apply)
    assert (g, b) == (1, 1)
    assert census(m) == {"MatMul": 1, "BiasGelu": 1}  # a Gemm becomes MatMul: its C is the BiasGelu bias
    check(m)
    np.testing.assert_allclose(run(m, {"a": X})[0], want, rtol=1e-5, atol=1e-5)


def test_gelu_without_linear_bias_stays_gelu():
    m = gelu_graph("x_first")
    (g, b), _ = apply_rules(m, gelu.RULE.apply, bias_gelu.RULE.apply)
    assert (g, b) == (1, 0) and census(m) == {"Gelu": 1}

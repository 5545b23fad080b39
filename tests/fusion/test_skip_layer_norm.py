import numpy as np
import pytest

from tests.fusion.encoder_graphs import H, apply_rules, residual_graph
from tests.fusion.graphs import run
from webbuild.fusion import skip_layer_norm
from webbuild.fusion.validate import check
from webbuild.graph.ir import census

RNG = np.random.default_rng(3)
FEEDS = {"a": RNG.standard_normal((7, H)).astype(np.float32), "b": RNG.standard_normal((7, H)).astype(np.float32)}


@pytest.mark.parametrize("bias, ops", [(None, {"MatMul": 1}), ("add", {"MatMul": 1}), ("gemm", {"MatMul": 1})])
def test_residual_and_projection_bias_fold_into_skip_layer_norm(bias, ops):
    m = residual_graph(bias)
    want = run(m, FEEDS)[0]
    (n,), report = apply_rules(m, skip_layer_norm.RULE.apply)
    assert n == 1 and not report.missed
    # the residual goes on from output 3; a projection bias (Add or Gemm C) is the op's 5th input
    assert census(m) == {**ops, "SkipLayerNormalization": 1, "Add": 1}
    skip = next(node for node in m.graph if node.op_type == "SkipLayerNormalization")
    assert (len(skip.inputs) == 5) == (bias is not None)
    assert skip.outputs[3].consumers()
    check(m)
    np.testing.assert_allclose(run(m, FEEDS)[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind, why", [("constant", "constant operand"), ("broadcast", "rank")])
def test_non_residual_add_is_left_and_reported(kind, why):
    m = residual_graph(constant_skip=kind == "constant", broadcast=kind == "broadcast")
    before = census(m)
    (n,), report = apply_rules(m, skip_layer_norm.RULE.apply)
    assert n == 0 and census(m) == before
    assert why in report.missed[0]["why"]

import numpy as np
import onnx_ir as ir
import pytest

from tests.fusion.graphs import H, rms_graph, run
from webbuild.fusion import cleanup, rms_norm
from webbuild.fusion.rule_report import Report
from webbuild.fusion.validate import check
from webbuild.graph.ir import census, dead_code_elimination


@pytest.mark.parametrize("spelling", ["div1", "recip", "divx", "mulsq"])
@pytest.mark.parametrize("weight", [True, False])
def test_each_spelling_fuses_with_same_output(spelling, weight):
    m = rms_graph(spelling, weight=weight)
    x = np.random.default_rng(1).standard_normal((2, 3, H)).astype(np.float32) * 3
    want = run(m, {"x": x})[0]
    report = Report()
    assert rms_norm.RULE.apply(m, report) == 1
    dead_code_elimination(m)
    ops = census(m)
    assert ops.get("SimplifiedLayerNormalization") == 1 and "ReduceMean" not in ops and "Sqrt" not in ops
    node = next(n for n in m.graph if n.op_type == "SimplifiedLayerNormalization")
    assert node.attributes["stash_type"].value == 1
    assert node.attributes["epsilon"].value == pytest.approx(1e-6)
    check(m)
    np.testing.assert_allclose(run(m, {"x": x})[0], want, rtol=1e-5, atol=1e-6)


def test_reduction_over_other_axis_is_left_and_reported():
    m = rms_graph("recip", axis=1)
    before = census(m)
    report = Report()
    assert rms_norm.RULE.apply(m, report) == 0
    assert census(m) == before
    assert report.missed and "last axis" in report.missed[0]["why"]


def test_zoo_decoder_has_no_decomposed_norm_left(source):
    layout, exporter, path = source
    from webbuild.fusion.fuse_decoder import load_source

    m, _ = load_source(path)
    cleanup.apply(m)
    report = Report()
    n = rms_norm.RULE.apply(m, report)
    dead_code_elimination(m)
    ops = census(m)
    # 4 layers x (input, post-attention, q, k) + final norm
    assert n == 17 and ops["SimplifiedLayerNormalization"] == 17
    assert not {"Pow", "ReduceMean", "Sqrt", "Reciprocal"} & set(ops)
    assert not report.missed
    check(m)


def test_norm_without_weight_of_unknown_width_is_left_and_reported():
    """SimplifiedLayerNormalization needs a scale; without one in the source the rule makes ones of x's
    width, which a symbolic last axis does not give."""
    m = rms_graph("recip", weight=False)
    m.graph.inputs[0].shape = ir.Shape(["b", 3, "hidden"])
    before = census(m)
    report = Report()
    assert rms_norm.RULE.apply(m, report) == 0
    assert census(m) == before
    assert report.missed and "width" in report.missed[0]["why"]

import numpy as np

from tests.fusion.graphs import H, residual_graph, run
from tests.fusion.partial import partly_fused
from webbuild.fusion import rms_norm, skip_rms_norm
from webbuild.fusion.rule_report import Report
from webbuild.fusion.validate import check
from webbuild.graph.ir import census, dead_code_elimination


def test_residual_add_folds_and_sum_continues_through_output_3():
    m = residual_graph(bias=False)
    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal((2, 3, H)).astype(np.float32),
             "b_in": rng.standard_normal((2, 3, H)).astype(np.float32)}
    want = run(m, feeds)
    report = Report()
    rms_norm.RULE.apply(m, report)
    assert skip_rms_norm.RULE.apply(m, report) == 1
    dead_code_elimination(m)
    skip = next(n for n in m.graph if n.op_type == "SkipSimplifiedLayerNormalization")
    nxt = next(n for n in m.graph if n.name == "next_residual")
    assert skip.domain == "com.microsoft" and skip.outputs[3] in nxt.inputs
    assert census(m).get("Add", 0) == 1  # only the next residual is left
    check(m)
    np.testing.assert_allclose(run(m, feeds)[0], want[0], rtol=1e-5, atol=1e-5)


def test_bias_add_is_not_a_residual():
    m = residual_graph(bias=True)
    report = Report()
    rms_norm.RULE.apply(m, report)
    assert skip_rms_norm.RULE.apply(m, report) == 0
    assert "SkipSimplifiedLayerNormalization" not in census(m)
    assert report.missed[-1]["why"] == "Add has a constant operand"


def test_zoo_decoder_residual_chain(source):
    _, _, path = source
    m, report = partly_fused(path, [rms_norm.RULE.apply, skip_rms_norm.RULE.apply])
    ops = census(m)
    # 2 per layer (post-attention and next input norm / final norm); layer 0's input norm stays plain
    assert ops["SkipSimplifiedLayerNormalization"] == 8
    assert ops["SimplifiedLayerNormalization"] == 9
    skips = [n for n in m.graph if n.op_type == "SkipSimplifiedLayerNormalization"]
    for prev, cur in zip(skips, skips[1:]):
        assert cur.inputs[0] is prev.outputs[3]  # residual chained, no Add in between
    norms = ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")
    assert not [n for n in m.graph if n.op_type in norms and n.inputs[0].producer() is not None
                and n.inputs[0].producer().op_type == "Add"]
    check(m)

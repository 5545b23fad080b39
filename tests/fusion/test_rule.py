"""The rules' driver: anchors, hits and misses in the report, graph-level rules, rule lists under flags."""

import onnx_ir as ir

from webbuild.fusion.rule import Miss, Rule, Step, run
from webbuild.fusion.rule_report import Report
from webbuild.graph.ir import census, replace


def _graph() -> ir.Model:
    """x -> Neg "a" -> Neg "b" -> Relu -> Neg "c" -> Neg "other" (domain "custom") -> y."""
    x = ir.Value(name="x", shape=ir.Shape([2]), type=ir.TensorType(ir.DataType.FLOAT))
    nodes = [ir.node("Neg", [x], name="a")]
    nodes.append(ir.node("Neg", [nodes[-1].outputs[0]], name="b"))
    nodes.append(ir.node("Relu", [nodes[-1].outputs[0]], name="relu"))
    nodes.append(ir.node("Neg", [nodes[-1].outputs[0]], name="c"))
    nodes.append(ir.node("Neg", [nodes[-1].outputs[0]], domain="custom", name="other"))
    y = nodes[-1].outputs[0]
    y.name, y.shape, y.type = "y", x.shape, x.type
    return ir.Model(ir.Graph([x], [y], nodes=nodes, opset_imports={"": 18, "custom": 1}), ir_version=9)


def _double_negation(neg: ir.Node):
    """Neg(Neg(x)) -> x; a Neg of a graph input is not this rule's business; any other Neg is a miss."""
    inner = neg.inputs[0].producer()
    if inner is None:
        return None
    return inner if inner.op_type == "Neg" else Miss(f"input from {inner.op_type}")


def _skip_both(g: ir.Graph, inner: ir.Node) -> None:
    outer = next(iter(inner.outputs[0].consumers()))
    replace(outer.outputs[0], inner.inputs[0])


DOUBLE_NEG = Rule("double_neg", ("Neg",), _double_negation, _skip_both, domain="")


def test_hits_are_counted_and_misses_reported_with_rule_anchor_and_reason():
    m, report = _graph(), Report()
    assert DOUBLE_NEG.apply(m, report) == 1
    assert report.fused == {"double_neg": 1}
    # "a" reads a graph input (None: not reported); "other" is in another domain (not an anchor)
    assert report.missed == [{"rule": "double_neg", "at": "c", "why": "input from Relu"}]
    assert m.graph.node("relu").inputs[0].name == "x"


def test_graph_level_rule_reports_where_it_says_and_adds_notes():
    seen = []
    rule = Rule("whole_graph", (), lambda g: seen.append(g) or Miss("no logits output", "logits"), _skip_both,
                notes=lambda hits: [f"whole_graph: {hits} rewrites"])
    m, report = _graph(), Report()
    assert rule.apply(m, report) == 0
    assert seen == [m.graph] and report.fused == {}
    assert report.missed == [{"rule": "whole_graph", "at": "logits", "why": "no logits output"}]
    assert report.notes == ["whole_graph: 0 rewrites"]


def test_setup_runs_before_each_graph():
    anchors: list[str] = []
    rule = Rule("count", ("Relu",), lambda n: anchors.append(n.name), _skip_both, setup=anchors.clear)
    for _ in range(2):
        rule.apply(_graph(), Report())
        assert anchors == ["relu"]


def test_run_applies_the_steps_whose_flag_is_set_and_drops_dead_nodes():
    passes = []
    never = Rule("never", ("Relu",), lambda n: Miss("must not run"), _skip_both)
    steps = (Step(passes.append), Step(DOUBLE_NEG, when="on"), Step(never, when="off"))
    m, report = _graph(), Report()
    run(m, steps, report, {"on": True, "off": False})
    assert passes == [m] and report.fused == {"double_neg": 1} and len(report.missed) == 1
    assert census(m) == {"Neg": 2, "Relu": 1}  # "a" and "b" are gone

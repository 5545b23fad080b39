import onnx_ir as ir

from tests.fusion.partial import partly_fused
from webbuild.fusion import gqa, merge_split, rms_norm, skip_rms_norm
from webbuild.fusion.validate import check
from webbuild.graph.ir import dead_code_elimination
from webbuild.site.contract import IO


def test_split_becomes_one_decoder_with_merged_interface(zoo):
    m, report = partly_fused(zoo.source("qwen3-asr-split", "torchscript"),
                             [rms_norm.RULE.apply, skip_rms_norm.RULE.apply, gqa.rule(2048).apply])
    assert merge_split.is_split_init(m)
    assert merge_split.RULE.apply(m, report)
    dead_code_elimination(m)
    inputs, outputs = IO.decoder(4)
    assert [v.name for v in m.graph.inputs] == inputs
    assert [v.name for v in m.graph.outputs] == outputs
    key = m.graph.inputs[2]
    assert list(key.shape)[1:2] == [2] and list(key.shape)[3:] == [64]
    check(m)


def test_split_without_gqa_is_left_alone(zoo):
    """No GQA (e.g. attention not recognised): the stacked KV cannot be unstacked per layer."""
    m, report = partly_fused(zoo.source("qwen3-asr-split", "torchscript"), [rms_norm.RULE.apply])
    names = [v.name for v in m.graph.inputs]
    assert not merge_split.RULE.apply(m, report)
    assert [v.name for v in m.graph.inputs] == names
    assert report.missed[-1]["rule"] == "merge_split"
    check(m)


def test_merged_source_is_not_a_split_init(zoo):
    m = ir.load(zoo.source("merged", "torchscript"))
    assert not merge_split.is_split_init(m)

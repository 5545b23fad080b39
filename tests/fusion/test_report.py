"""What fusion left alone, told once at the end (which rule, where, why), and --strict / fusion.strict
turning an unfused attention or norm into exit code 1."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from webbuild.cli import main
from webbuild.fusion.rule_report import strict_failures, summary

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny-asr" / "model"
WHY = "K is not transposed to [B, heads, hd, T]"


def unfused_attention(path: Path) -> Path:
    """Scores x @ x^T -> Softmax -> @ x: attention as no exporter spells it (K never transposed to
    [B, heads, hd, T]), which the gqa rule recognises by its Softmax and reports."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["x", "xt"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "x"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "attention", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 18)])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return path


def test_summary_groups_misses_by_rule_and_reason_with_places():
    misses = [{"rule": "gqa", "at": f"layer{i}/Softmax", "why": WHY} for i in range(5)]
    misses.append({"rule": "matmul_nbits", "at": "dq", "why": "block size 8"})
    graphs = {"decoder": {"not_fused": misses, "ops": {"Softmax": 5, "MatMul": 3}},
              "encoder": {"not_fused": [], "ops": {"ReduceMean": 2}}}
    assert summary(graphs) == [
        "not fused:",
        f"  decoder: gqa x5: {WHY}",
        "    at layer0/Softmax, layer1/Softmax, layer2/Softmax (+2 more in the JSON report)",
        "  decoder: matmul_nbits x1: block size 8",
        "    at dq",
        "  decoder: 5 Softmax left (attention not fused)",
        "  encoder: 2 ReduceMean left (norm not fused)",
    ]
    # a quantized weight left decomposed fails --strict too: it would ship as float
    assert strict_failures(graphs) == ["decoder: 5 attention patterns not fused",
                                       "decoder: 1 quantized MatMul pattern not fused",
                                       "encoder: 2 norm patterns not fused"]
    graphs["decoder"] = {"not_fused": [{"rule": "packed_qkv", "at": "x", "why": "y"}], "ops": {"MatMul": 3}}
    del graphs["encoder"]
    assert strict_failures(graphs) == [] and len(summary(graphs)) == 3
    assert summary({"decoder": {"not_fused": misses[:5], "ops": {}}}, shown=None)[2].count("/Softmax") == 5
    assert summary({"decoder": {"not_fused": [], "ops": {"MatMul": 1}}}) == []


def test_webbuild_fuse_tells_misses_once_at_the_end_and_strict_exits_1(tmp_path):
    src = unfused_attention(tmp_path / "src" / "decoder_model_merged.onnx")
    result = CliRunner().invoke(main, ["fuse", str(src), "-o", str(tmp_path / "out"), "--no-quantize"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    at = lines.index("not fused:")
    told = lines[at + 1:]
    assert told[:2] == [f"  decoder: gqa x1: {WHY}", "    at Softmax"]
    assert told[-2:] == ["  decoder: 1 Softmax left (attention not fused)", "    at Softmax"]  # and where
    # prune_lm_head finds no lm_head here either: every rule's misses are in the one list, two lines each
    assert len(told) == 6 and told[2].startswith("  decoder: prune_lm_head x1: ")
    assert sum(WHY in line for line in lines) == 1  # told once, not also as it happened
    assert lines[at - 1].startswith("total")  # after the op table
    strict = CliRunner().invoke(main, ["fuse", str(src), "-o", str(tmp_path / "out2"), "--no-quantize", "--strict"])
    assert strict.exit_code == 1
    assert "error: decoder: 1 attention pattern not fused (--strict; where and why: above)" in strict.output
    assert (tmp_path / "out2" / "decoder.onnx").is_file()  # written all the same


def test_strict_passes_a_source_that_fuses_whole(tmp_path):
    result = CliRunner().invoke(main, ["fuse", str(TINY), "-o", str(tmp_path / "out"), "--no-quantize", "--strict"])
    assert result.exit_code == 0, result.output
    assert "not fused" not in result.output


def test_fusion_strict_stops_the_build_with_exit_code_1(tmp_path):
    """The fuse stage of a build with fusion.strict, on graphs the source stage would refuse (a bare attention
    as decoder and encoder): the stage itself, as the runner calls it."""
    from webbuild.config import load_config
    from webbuild.errors import FusionIncomplete
    from webbuild.layouts import layout
    from webbuild.pipeline.build_report import BuildReport
    from webbuild.pipeline.stages import stage_fuse
    from webbuild.pipeline.state import BuildContext, BuildState, SourceModel

    src = tmp_path / "model"
    unfused_attention(src / "decoder_model_merged.onnx")
    shutil.copyfile(src / "decoder_model_merged.onnx", src / "encoder.onnx")
    for name in ("embed_tokens.bin", "config.json", "tokenizer.json"):
        shutil.copyfile(TINY / name, src / name)
    yaml = tmp_path / "model.yaml"
    yaml.write_text("name: t\nsource: {layout: merged, dir: ./model}\nfusion: {strict: true}\n")
    cfg = load_config(yaml)
    (tmp_path / "work").mkdir()
    ctx = BuildContext(cfg, tmp_path / "site", tmp_path / "work", BuildReport(name="t"),
                       BuildState(SourceModel(cfg.source.dir, layout(cfg.source.layout))))
    with pytest.raises(FusionIncomplete) as exc:
        stage_fuse(ctx)
    assert exc.value.exit_code == 1
    error = exc.value.format_message().splitlines()
    assert error[0] == "decoder: 1 attention pattern not fused; encoder: 1 attention pattern not fused (fusion.strict)"
    assert f"  decoder: gqa x1: {WHY}" in error and "    at Softmax" in error
    assert any(line.startswith("  encoder: encoder_attention x1: ") for line in error)


def test_the_build_table_ends_with_what_was_not_fused():
    from webbuild.pipeline.build_report import BuildReport

    census = {"nodes": 4, "ops": {"Softmax": 1, "MatMul": 3}}
    miss = {"rule": "gqa", "at": "Softmax", "why": WHY}
    report = BuildReport(name="t", graphs={"decoder_init": {"source": census},  # a source-only graph
                                           "decoder": {"source": census, "fused": census, "not_fused": [miss]}})
    assert report.table().splitlines()[-4:] == ["not fused:", f"  decoder: gqa x1: {WHY}", "    at Softmax",
                                                "  decoder: 1 Softmax left (attention not fused)"]
    report.graphs["decoder"].update(not_fused=[], fused={"nodes": 2, "ops": {"GroupQueryAttention": 1, "MatMul": 1}})
    assert "not fused" not in report.table()


def test_strict_rules_name_registered_attention_and_norm_rules():
    from webbuild.fusion import fuse_encoder
    from webbuild.fusion.fuse_decoder import decoder_steps
    from webbuild.fusion.rule import Rule
    from webbuild.fusion.rule_report import STRICT_RULES

    names = {s.action.name for s in (*decoder_steps(None), *fuse_encoder.STEPS) if isinstance(s.action, Rule)}
    assert set(STRICT_RULES) <= names

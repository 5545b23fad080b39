"""Opt-in WebGPU form: Q/K norms inside GQA, and its inverse. onnxruntime's CPU GQA refuses
q_norm_weight, so the form's numbers are checked on WebGPU (tests/test_decoder_webgpu.py); here its
structure, and that the inverse gives back the explicit graph."""

import onnx_ir as ir
import pytest

from webbuild.fusion import qk_norm_in_gqa
from webbuild.fusion.fuse_decoder import fuse_decoder, save
from webbuild.fusion.parity import MergedRunner, compare, embed_table
from webbuild.fusion.validate import check_file
from webbuild.graph.ir import census, dead_code_elimination, nodes_per_layer


@pytest.fixture(scope="module")
def genai_webgpu(genai_build):
    return genai_build("webgpu")


def test_norm_weights_move_into_gqa(zoo, tmp_path, genai_webgpu):
    model, report = fuse_decoder(zoo.source("merged", "torchscript"), qk_norm="gqa")
    ops = report["ops_after"]
    assert report["fused"]["qk_norm_in_gqa"] == 4
    assert ops["SimplifiedLayerNormalization"] == 1 and "Reshape" not in ops  # only layer 0's input norm
    gqa = next(n for n in model.graph if n.op_type == "GroupQueryAttention")
    theirs = next(n for n in ir.load(genai_webgpu).graph if n.op_type == "GroupQueryAttention")
    assert [v is None for v in gqa.inputs] == [v is None for v in theirs.inputs]  # same slots used
    assert gqa.inputs[14].const_value.shape == (64,)
    assert gqa.attributes["qk_norm_epsilon"].value == pytest.approx(1e-6)
    assert nodes_per_layer(model) <= nodes_per_layer(ir.load(genai_webgpu))
    check_file(save(model, tmp_path))  # valid graph; onnxruntime CPU loads it


def test_unknown_mode_is_rejected(zoo):
    with pytest.raises(ValueError, match="qk_norm"):
        fuse_decoder(zoo.source("merged", "torchscript"), qk_norm="inside")


def test_take_out_gives_back_the_explicit_graph(zoo, tmp_path):
    src = zoo.source("merged", "torchscript")
    explicit, _ = fuse_decoder(src)
    inside, _ = fuse_decoder(src, qk_norm="gqa")
    assert qk_norm_in_gqa.take_out(inside) == 4
    dead_code_elimination(inside)
    assert census(inside) == census(explicit)
    gqa = next(n for n in inside.graph if n.op_type == "GroupQueryAttention")
    assert len(gqa.inputs) == 9 and "qk_norm_epsilon" not in gqa.attributes  # as fuse_decoder makes it
    runners = [MergedRunner(save(m, tmp_path / name)) for name, m in (("explicit", explicit), ("taken_out", inside))]
    result = compare(*runners, embed_table(src.parent))
    assert result["max_rel_err"] == 0.0 and result["tokens_equal"]
    assert qk_norm_in_gqa.take_out(explicit) == 0


def test_genai_webgpu_graph_is_left_unchanged(genai_webgpu):
    """The genai builder's webgpu graph (Q/K norms inside GQA, fed by a Split of the packed QKV) is already
    fused: nothing changes, so its numbers stay the builder's (onnxruntime CPU cannot check this form)."""
    model, report = fuse_decoder(genai_webgpu)
    assert not report["fused"] and not report["not_fused"]
    assert census(model) == census(ir.load(genai_webgpu))

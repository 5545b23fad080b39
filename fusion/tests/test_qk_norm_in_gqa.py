"""Opt-in WebGPU form: Q/K norms inside GQA. Structure only: onnxruntime's CPU GQA refuses
q_norm_weight, so numbers can only be checked on a WebGPU/CUDA runtime."""

import onnx_ir as ir
import pytest

from fusion._ir import nodes_per_layer
from fusion.fuse import fuse_decoder, save
from fusion.tests.test_fuse import build_genai
from fusion.validate import check_file


@pytest.fixture(scope="module")
def genai_webgpu(zoo, tmp_path_factory):
    return build_genai(zoo, tmp_path_factory.mktemp("genai-webgpu"), "webgpu")


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

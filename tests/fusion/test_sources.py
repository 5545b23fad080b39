"""Beyond the Qwen3-ASR zoo: Llama (no Q/K norm, theta 1e4), Qwen2 (Q/K/V biases), Qwen3 CausalLMs,
a decoder whose projections are already int4 MatMulNBits, and torch.onnx's dynamo exports of SDPA at
opsets 20 and 23."""

import pytest

from tests.fusion.sources import dynamo_sdpa
from webbuild.fusion import parity
from webbuild.fusion.fuse_decoder import fuse_decoder, save
from webbuild.fusion.validate import check_file
from webbuild.graph.census import op_census


def _fuse_and_compare(path, tmp_path):
    model, report = fuse_decoder(path)
    out = save(model, tmp_path)
    check_file(out)
    folder = path if path.is_dir() else path.parent
    r = parity.compare(parity.source_runner(path), parity.MergedRunner(out), parity.embed_table(folder))
    return model, report, r


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_decoder_families(zoo, family, tmp_path):
    model, report, r = _fuse_and_compare(zoo.family(family), tmp_path)
    ops = report["ops_after"]
    assert ops["GroupQueryAttention"] == 2 and "Softmax" not in ops and "ReduceMean" not in ops
    assert ops["SkipSimplifiedLayerNormalization"] == 4
    assert report["not_fused"] == []
    if family == "qwen3":
        assert ops["SimplifiedLayerNormalization"] == 5 and ops["Split"] == 2
    else:  # no Q/K norm: GQA takes the packed QKV itself, no Split, no Reshape
        gqa = next(n for n in model.graph if n.op_type == "GroupQueryAttention")
        assert gqa.inputs[1] is None and gqa.inputs[2] is None
        assert "Split" not in ops and "Reshape" not in ops
    if family == "qwen2":
        assert ops["Add"] == 2  # one packed Q/K/V bias per layer
    assert r["max_rel_err"] < 1e-4 and r["tokens_equal"], r


@pytest.mark.parametrize("layout", ["merged", "qwen3-asr-split"])
def test_matmulnbits_source(zoo, layout, tmp_path):
    model, report, r = _fuse_and_compare(zoo.quantized(layout), tmp_path)
    ops = report["ops_after"]
    assert report["ops_before"]["MatMulNBits"] == 29  # 7 per layer + lm_head
    assert ops["MatMulNBits"] == 21 and ops["GroupQueryAttention"] == 4 and "MatMul" not in ops
    assert report["nodes_after"] == 81 and report["not_fused"] == []
    packed = next(n for n in model.graph if n.op_type == "MatMulNBits")
    assert packed.attributes["N"].value == 512 and packed.attributes["block_size"].value == 64
    assert r["max_rel_err"] < 1e-4 and r["tokens_equal"], r


@pytest.mark.parametrize("opset", [20, 23])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_dynamo_sdpa_exports(zoo, family, opset, tmp_path):
    """torch.onnx's dynamo path on scaled_dot_product_attention: at opset 20 SDPA decomposed, K transposed by
    Reshape -> Transpose -> Reshape; at opset 23 the standard Attention, RotaryEmbedding and RMSNormalization
    ops. Both fuse whole (one GQA per layer, nothing standard left: --strict passes) with parity."""
    src = dynamo_sdpa(zoo, family, opset)
    standard = {"Attention", "RotaryEmbedding", "RMSNormalization"}
    before = {n: c for n, c in op_census(src / "decoder_model_merged.onnx").items() if n in standard}
    assert bool(before) == (opset == 23), before
    model, report, r = _fuse_and_compare(src / "decoder_model_merged.onnx", tmp_path)
    ops = report["ops_after"]
    assert ops["GroupQueryAttention"] == 2 and not {"Softmax", *standard} & set(ops)
    assert report["not_fused"] == [] and report["left_over"] == []
    assert r["max_rel_err"] < 1e-4 and r["tokens_equal"], r


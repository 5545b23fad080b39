"""torch.onnx's dynamo exports of Hugging Face CausalLMs (tests/fusion/dynamo_export.py) across the families
whose attention is spelt beyond Llama's (Q/K norms after the head transpose, NoPE, interleaved and partial
rotary, LayerNorm decoders, Gemma2's attention softcap), eager attention at opset 18 and SDPA at opset 23
(the standard Attention, RotaryEmbedding, RMSNormalization): one GQA per layer, nothing left for --strict,
greedy tokens and logits within 1e-4 of their range against the source on onnxruntime CPU. Cached in the
zoo's folder under a key of the exporting code."""

import json

import pytest

from tests.fusion.dynamo_export import CASES, cached
from webbuild.fusion.fuse_decoder import fuse_decoder, save
from webbuild.fusion.parity import compare_tokens
from webbuild.fusion.rule_report import strict_failures


@pytest.fixture(scope="module", params=CASES, ids=[f"{f}-{a}-opset{o}" for f, a, o in CASES])
def fused(request, zoo, tmp_path_factory):
    family, attention, opset = request.param
    src = cached(zoo, family, attention, opset)
    model, report = fuse_decoder(src / "model.onnx")
    out = save(model, tmp_path_factory.mktemp(family))
    return src, json.loads((src / "config.json").read_text()), model, report, out


def test_one_gqa_per_layer_nothing_left_and_parity(fused):
    src, cfg, model, report, out = fused
    ops = report["ops_after"]
    assert ops.get("GroupQueryAttention") == cfg["num_hidden_layers"], report["not_fused"]
    assert not {"Softmax", "Attention", "RotaryEmbedding", "RMSNormalization", "ReduceMean"} & set(ops)
    assert strict_failures({"decoder": {"not_fused": report["not_fused"], "ops": ops,
                                        "left_over": report["left_over"]}}) == []
    r = compare_tokens(src / "model.onnx", out, cfg["vocab_size"], prefill=10, steps=16)
    assert r["max_rel_err"] <= 1e-4 and r["tokens_equal"], r["per_step_rel_err"]


def test_gemma2_attention_softcap_becomes_gqa_softcap(fused):
    """Gemma2's eager attention caps the scores (c * tanh(scores / c), before the mask): GQA's softcap. At
    c = 0.5 it matters: without it the logits move by ~1e-2 of their range (measured), here within 1e-4."""
    _, cfg, model, _, _ = fused
    caps = {n.attributes["softcap"].value for n in model.graph if n.op_type == "GroupQueryAttention"
            and "softcap" in n.attributes}
    assert caps == ({cfg["attn_logit_softcapping"]} if cfg.get("attn_logit_softcapping") else set())

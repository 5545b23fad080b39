"""fp16 and q4f16 decoders as transformers.js publishes them (Optimum, then onnxruntime's float16 converter;
tests/fusion/fp16_export.py) fuse to one GroupQueryAttention per layer in fp16, its cos/sin caches computed
in fp32 from the graph's inv_freq (the source's fp16 angles are exact only at the first positions), and
decode as the source does on onnxruntime CPU: logits within 2e-2 of their range."""

import json

import numpy as np
import pytest

from tests.fusion.fp16_export import converted
from webbuild.fusion.fuse_decoder import fuse_decoder, save
from webbuild.fusion.parity import compare_tokens
from webbuild.fusion.rule_report import strict_failures
from webbuild.graph.ir import census

pytestmark = [pytest.mark.torch]  # made from the Optimum exports (torch, in the exporter's venv)

CASES = [("llama", "fp16"), ("llama", "q4f16"), ("qwen3", "fp16"), ("qwen3", "q4f16"), ("glm", "fp16"),
         ("gemma3", "fp16"), ("smollm3", "q4f16")]


@pytest.fixture(scope="module", params=CASES, ids=[f"{f}-{k}" for f, k in CASES])
def fused(request, tmp_path_factory):
    family, kind = request.param
    src = converted(family, kind)
    model, report = fuse_decoder(src / "model.onnx")
    out = save(model, tmp_path_factory.mktemp(f"{family}-{kind}"))
    return kind, src, json.loads((src / "config.json").read_text()), model, report, out


def test_one_fp16_gqa_per_layer_and_strict_passes(fused):
    kind, _, cfg, model, report, _ = fused
    ops = census(model)
    assert ops.get("GroupQueryAttention") == cfg["num_hidden_layers"], report["not_fused"]
    assert "Softmax" not in ops and not report["not_fused"] and not report["left_over"]
    assert (kind == "q4f16") == ("MatMulNBits" in ops)
    for name, v in model.graph.initializers.items():
        if name.startswith(("cos_cache", "sin_cache")):
            assert v.const_value.numpy().dtype == np.float16  # GQA's caches in the attention's type
    assert strict_failures({"decoder": {"not_fused": [], "ops": ops, "left_over": report["left_over"]}}) == []


def test_logits_match_the_source_within_fp16_tolerance(fused):
    _, src, cfg, _, _, out = fused
    r = compare_tokens(src / "model.onnx", out, cfg["vocab_size"], prefill=10, steps=16)
    assert r["max_rel_err"] <= 2e-2, r["per_step_rel_err"]


def test_fusing_again_changes_nothing(fused):
    _, _, _, _, report, out = fused
    again, second = fuse_decoder(out)
    assert census(again) == report["ops_after"] and not second["fused"] and not second["not_fused"]


def test_q8_attention_fuses_and_strict_names_the_int8_matmuls(tmp_path):
    """transformers.js's q8 (dynamic int8): attention and norms fuse with parity; its MatMulInteger projections
    are a quantized MatMul no rule rebuilds (MatMulNBits would drop the run-time activation quantization the
    source computes), so --strict fails on them, by name."""
    src = converted("llama", "q8")
    model, report = fuse_decoder(src / "model.onnx")
    ops = census(model)
    assert ops.get("GroupQueryAttention") == 2 and "Softmax" not in ops and "ReduceMean" not in ops
    graphs = {"decoder": {"not_fused": report["not_fused"], "ops": ops, "left_over": report["left_over"]}}
    assert strict_failures(graphs) == [f"decoder: {ops['MatMulInteger']} quantized MatMul patterns not fused"]
    assert {item["op"] for item in report["left_over"]} == {"MatMulInteger"}  # the lookup's DequantizeLinear is none
    cfg = json.loads((src / "config.json").read_text())
    r = compare_tokens(src / "model.onnx", save(model, tmp_path), cfg["vocab_size"], prefill=10, steps=16)
    assert r["max_rel_err"] <= 1e-4 and r["tokens_equal"], r["per_step_rel_err"]

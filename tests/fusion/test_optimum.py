"""Decoders exported by Hugging Face Optimum (`optimum-cli export onnx --task text-generation-with-past`,
the real exporter in its own venv: tests/fusion/exporters.py) fuse to one GroupQueryAttention per
layer, and decode as the source does on onnxruntime CPU: the same greedy tokens over 16 steps with the
KV cache, logits within 1e-4 of their range."""

import json
import subprocess
import sys

import pytest

from tests.fusion.exporters import FAMILIES, export
from webbuild.fusion.fuse_decoder import fuse_decoder, save
from webbuild.fusion.parity import compare_tokens
from webbuild.fusion.validate import check
from webbuild.graph.ir import census

# the exports are torch's, in the exporter's own venv (`make optimum-fixtures` makes them, minutes the first time)
pytestmark = [pytest.mark.torch]


@pytest.fixture(scope="module", params=FAMILIES)
def fused(request, tmp_path_factory):
    """(family, source folder, HF config, fused model, report, saved fused decoder)."""
    src = export(request.param)
    model, report = fuse_decoder(src / "model.onnx")
    out = save(model, tmp_path_factory.mktemp(f"optimum-{request.param}"))
    return request.param, src, json.loads((src / "config.json").read_text()), model, report, out


def test_one_gqa_per_layer_and_no_softmax(fused):
    family, _, cfg, model, report, _ = fused
    ops = census(model)
    assert ops.get("GroupQueryAttention") == cfg["num_hidden_layers"], report["not_fused"]
    assert not {"Softmax", "Cos", "Sin", "Neg", "Expand", "IsNaN", "Where"} & set(ops)
    assert not [m for m in report["not_fused"] if m["rule"] == "gqa"]
    for node in (n for n in model.graph if n.op_type == "GroupQueryAttention"):
        a = {k: v.value for k, v in node.attributes.items()}
        hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        assert (a["num_heads"], a["kv_num_heads"]) == (cfg["num_attention_heads"], cfg["num_key_value_heads"])
        assert a["scale"] == pytest.approx(hd ** -0.5)
        assert a.get("local_window_size") == cfg.get("sliding_window")  # Mistral's window, found by the mask's values
        # Q, K, V packed (Phi-3's qkv_proj as it is); Qwen3's Q/K norms need them apart (a Split)
        assert (node.inputs[1] is None) == (family != "qwen3")
    # the caches span the model's positions (config.json beside the export)
    assert model.graph.initializers["cos_cache"].const_value.shape[0] == cfg["max_position_embeddings"]
    check(model)


def test_greedy_tokens_and_logits_match_the_source(fused):
    family, src, cfg, _, _, out = fused
    r = compare_tokens(src / "model.onnx", out, cfg["vocab_size"], prefill=10, steps=16)
    assert r["tokens_equal"], (r["tokens_source"], r["tokens_fused"])
    assert r["max_rel_err"] <= 1e-4, r["per_step_rel_err"]
    assert len(set(r["tokens_source"])) > 1  # a decode that moves, so the KV cache is exercised


def test_webbuild_fuse_command_reports_no_unfused_attention(tmp_path):
    """The issue's own command, `webbuild fuse model.onnx -o out --no-quantize`, on the Llama export."""
    src = export("llama") / "model.onnx"
    run = subprocess.run([sys.executable, "-m", "webbuild.cli", "fuse", str(src), "-o", str(tmp_path / "out"),
                          "--no-quantize"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "not fused" not in run.stdout + run.stderr
    row = next(line for line in run.stdout.splitlines() if line.startswith("GroupQueryAttention"))
    assert row.split()[1:] == ["0", "->", "2"]

"""Export tiny random-weight decoders with Hugging Face Optimum, as a user would (run in the exporter's venv).

    python optimum_export.py FAMILY OUT_DIR

FAMILY is one of FAMILIES. The model is built from a config with random weights (no hub download),
saved with save_pretrained, then exported by `optimum-cli export onnx --task text-generation-with-past`
from that folder. This file imports neither webbuild nor the tests: the exporter's venv has only
torch, transformers and optimum-onnx.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

DIMS = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=512, rms_norm_eps=1e-5,
            tie_word_embeddings=False)
# family -> (config class, model class, extra config)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(rope_theta=10000.0)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(rope_theta=1_000_000.0)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(rope_theta=1_000_000.0, head_dim=16)),
    # a window shorter than the tests' decode (10 + 16 positions), so that it matters
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(rope_theta=10000.0, sliding_window=8)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(rope_theta=10000.0, pad_token_id=0)),
    # the spellings beyond rotate-half on the whole head, in odd shapes (head_dim not 64/128, 1-3 KV heads,
    # hidden not a power of two): Q/K norms on [B, heads, S, hd], a sliding and a global layer (Gemma3)
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(hidden_size=96, num_attention_heads=3, num_key_value_heads=1, head_dim=32, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=24)),
    # a NoPE layer (no_rope_layers 0)
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM",
                dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=3, no_rope_layers=[1, 0],
                     pad_token_id=0)),
    # interleaved rotary, LayerNorm without bias, attention and MLP in parallel, scaled logits
    "cohere": ("CohereConfig", "CohereForCausalLM", dict(rope_theta=10000.0, layer_norm_eps=1e-5)),
    "helium": ("HeliumConfig", "HeliumForCausalLM",
               dict(hidden_size=80, num_attention_heads=5, num_key_value_heads=1, head_dim=16)),
    # interleaved and partial (half the head), Q/K/V biases
    "glm": ("GlmConfig", "GlmForCausalLM", dict(head_dim=32, num_key_value_heads=2, pad_token_id=0)),
    # partial rotary on LayerNorm families: Phi-2 (0.5, parallel attention and MLP), StableLM (0.25), Nemotron (0.5)
    "phi": ("PhiConfig", "PhiForCausalLM",
            dict(hidden_size=96, num_attention_heads=3, num_key_value_heads=3, partial_rotary_factor=0.5)),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM",
                 dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, partial_rotary_factor=0.25)),
    # Q/K norms over the whole projection (OLMo2), none (OLMo: LayerNorm without weights), Gemma's (1 + w) norms,
    # Gemma2's attention softcap and alternating windows, Granite's multipliers and logit divisor
    "olmo": ("OlmoConfig", "OlmoForCausalLM", dict(pad_token_id=0)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(pad_token_id=0)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(head_dim=16)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
                    layer_types=["sliding_attention", "full_attention"])),
    # a softcap small enough to matter (Optimum's SDPA export drops it; eager exports keep it: dynamo_export.py)
    "gemma2-softcap": ("Gemma2Config", "Gemma2ForCausalLM",
                       dict(head_dim=16, sliding_window=8, query_pre_attn_scalar=16, attn_logit_softcapping=0.5,
                            layer_types=["sliding_attention", "full_attention"])),
    "granite": ("GraniteConfig", "GraniteForCausalLM",
                dict(embedding_multiplier=2.0, attention_multiplier=0.1, residual_multiplier=0.5,
                     logits_scaling=4.0)),
    # widths GQA's rotary kernels refuse (head and rotary widths multiples of 16): StableLM-3B's head of 80
    # with 20 rotary dims, and a head of 24
    "stablelm-hd80": ("StableLmConfig", "StableLmForCausalLM",
                      dict(hidden_size=160, num_attention_heads=2, num_key_value_heads=1, partial_rotary_factor=0.25)),
    "llama-hd24": ("LlamaConfig", "LlamaForCausalLM", dict(hidden_size=96, head_dim=24, rope_theta=10000.0)),
    # scaled RoPE: the angles carry the scaling (yarn: inv_freq and a factor on cos/sin; llama3: inv_freq)
    "llama-yarn": ("LlamaConfig", "LlamaForCausalLM",
                   dict(rope_theta=10000.0, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                          "original_max_position_embeddings": 128})),
    "llama-llama3": ("LlamaConfig", "LlamaForCausalLM",
                     dict(rope_theta=10000.0,
                          rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 128})),
    "nemotron": ("NemotronConfig", "NemotronForCausalLM",
                 dict(hidden_size=96, num_attention_heads=3, num_key_value_heads=1, head_dim=32,
                      partial_rotary_factor=0.5)),
}


def build(family: str, folder: Path, seed: int = 0) -> None:
    """A random-weight CausalLM of `family` saved in `folder`; norm weights and biases randomised too,
    so a dropped or misplaced norm or bias shows in the logits."""
    import torch
    import transformers as tf

    cfg_cls, model_cls, extra = FAMILIES[family]
    cfg = getattr(tf, cfg_cls)(**{**DIMS, **extra})
    torch.manual_seed(seed)
    model = getattr(tf, model_cls)(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.05 * torch.randn_like(p))  # larger ones swamp the 0.02-std weights: one token forever
    model.save_pretrained(folder)


def main(family: str, out: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        build(family, Path(tmp))
        cli = Path(sys.executable).with_name("optimum-cli")
        subprocess.run([str(cli), "export", "onnx", "--model", tmp, "--task", "text-generation-with-past", out],
                       check=True)


if __name__ == "__main__":
    main(*sys.argv[1:])

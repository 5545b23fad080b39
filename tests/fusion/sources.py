"""Extra fusion sources beyond the Qwen3-ASR zoo: other decoder families and pre-quantized graphs.

Families are tiny `transformers` CausalLMs exported in the merged layout with the zoo's attention
spelling (webbuild.zoo.wrappers: rotate_half RoPE, repeat_kv, -1e9 causal mask, fp32 softmax), so the
rules see what published exports look like for Llama (no Q/K norm), Qwen2 (Q/K/V biases) and Qwen3.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

FAMILY_DIMS = dict(hidden_size=128, intermediate_size=320, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=32, vocab_size=300, max_position_embeddings=512,
                   rms_norm_eps=1e-5, tie_word_embeddings=False)


def family_model(family: str, seed: int = 0):
    import torch
    import transformers as tf

    cls = {"llama": (tf.LlamaConfig, tf.LlamaForCausalLM), "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
           "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM)}[family]
    extra = {"rope_theta": 10000.0 if family == "llama" else 1_000_000.0}
    cfg = cls[0](**FAMILY_DIMS, **extra, attn_implementation="eager")
    torch.manual_seed(seed)
    model = cls[1](cfg).eval()
    with torch.no_grad():  # random norm weights, so a dropped or misplaced norm shows in the logits
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in name else 0.5 * torch.randn_like(p))
    return model


def _wrapper(model, sdpa: bool = False):
    import torch
    from torch import nn
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from webbuild.zoo import wrappers

    class Merged(nn.Module):
        """wrappers.MergedDecoder for a plain CausalLM (model.model.layers; Q/K norm optional)."""

        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, inputs_embeds, attention_mask, *past):
            q_len = inputs_embeds.shape[1]
            past_len = attention_mask.shape[1] - q_len
            pos = (torch.arange(q_len, dtype=torch.int64) + past_len).unsqueeze(0)
            pad = torch.where(attention_mask[:, None, None, :] > 0, 0.0, -1e9)
            mask = wrappers._causal_mask(q_len, past_len, inputs_embeds.dtype) + pad
            cos, sin = self.m.model.rotary_emb(inputs_embeds, pos)
            x, presents = inputs_embeds, []
            for i, layer in enumerate(self.m.model.layers):
                attn, res = layer.self_attn, x
                h = layer.input_layernorm(x)
                shape = (*h.shape[:-1], -1, attn.head_dim)
                qn, kn = getattr(attn, "q_norm", nn.Identity()), getattr(attn, "k_norm", nn.Identity())
                q = qn(attn.q_proj(h).view(shape)).transpose(1, 2)
                k = kn(attn.k_proj(h).view(shape)).transpose(1, 2)
                v = attn.v_proj(h).view(shape).transpose(1, 2)
                q, k = apply_rotary_pos_emb(q, k, cos, sin)
                k, v = torch.cat([past[2 * i], k], 2), torch.cat([past[2 * i + 1], v], 2)
                if sdpa:  # torch's fused op, as Hugging Face's "sdpa" attention calls it (repeat_kv first)
                    g = attn.num_key_value_groups
                    kr, vr = (t[:, :, None].expand(-1, -1, g, -1, -1).flatten(1, 2) for t in (k, v))
                    out = torch.nn.functional.scaled_dot_product_attention(q, kr, vr, attn_mask=mask,
                                                                           scale=attn.scaling).transpose(1, 2)
                else:
                    out = wrappers._attend(q, k, v, mask, attn.scaling, attn.num_key_value_groups)
                x = res + attn.o_proj(out.reshape(*h.shape[:-1], -1))
                x = x + layer.mlp(layer.post_attention_layernorm(x))
                presents += [k, v]
            return (self.m.lm_head(self.m.model.norm(x)), *presents)

    return Merged().eval()


def export_family(family: str, out: Path, exporter: str = "torchscript") -> Path:
    """A merged-layout export folder (decoder_model_merged.onnx + embed_tokens.bin + config.json)."""
    import torch

    from webbuild.site.contract import IO
    from webbuild.zoo.onnx_export import export_graph, save_sharing_weights

    model = family_model(family)
    d = FAMILY_DIMS
    inputs, outputs = IO.decoder(d["num_hidden_layers"])
    kv = [torch.randn(1, d["num_key_value_heads"], 6, d["head_dim"]) for _ in inputs[2:]]
    args = (torch.randn(1, 3, d["hidden_size"]), torch.ones(1, 9, dtype=torch.int64), *kv)
    dynamic = {"inputs_embeds": {0: "batch", 1: "seq_len"}, "attention_mask": {0: "batch", 1: "total_seq_len"},
               "logits": {0: "batch", 1: "seq_len"}}
    dynamic.update({n: {0: "batch", 2: "past_seq_len"} for n in inputs[2:]})
    dynamic.update({n: {0: "batch", 2: "total_seq_len"} for n in outputs[1:]})
    graph = export_graph(_wrapper(model), args, exporter, inputs, outputs, dynamic)
    out.mkdir(parents=True)
    save_sharing_weights({out / "decoder_model_merged.onnx": graph}, out / "decoder_model_merged.onnx.data")
    return write_embeddings_and_config(model, out)


def write_embeddings_and_config(model, out: Path) -> Path:
    """embed_tokens.bin and config.json beside a merged decoder export of `model` (FAMILY_DIMS): what the
    fuse stage reads besides the graph."""
    d = FAMILY_DIMS
    embed = model.model.embed_tokens.weight.detach().numpy().astype(np.float32)
    embed.tofile(out / "embed_tokens.bin")
    cfg = {"decoder": {"max_position_embeddings": d["max_position_embeddings"], "head_dim": d["head_dim"]},
           "embed_tokens_shape": list(embed.shape), "embed_tokens_dtype": "float32"}
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def export_dynamo_sdpa(family: str, out: Path, opset: int) -> Path:
    """A merged-layout folder like export_family's, the attention torch's scaled_dot_product_attention,
    exported by torch.onnx's dynamo path at `opset` (20: SDPA decomposed; 23: the standard Attention op)."""
    import torch

    from webbuild.site.contract import IO

    model = family_model(family)
    d = FAMILY_DIMS
    inputs, outputs = IO.decoder(d["num_hidden_layers"])
    kv = [torch.randn(1, d["num_key_value_heads"], 6, d["head_dim"]) for _ in inputs[2:]]
    args = (torch.randn(1, 3, d["hidden_size"]), torch.ones(1, 9, dtype=torch.int64), *kv)
    dyn = torch.export.Dim.DYNAMIC
    shapes = ({0: dyn, 1: dyn}, {0: dyn, 1: dyn}, tuple({0: dyn, 2: dyn} for _ in kv))
    out.mkdir(parents=True)
    with torch.no_grad():
        torch.onnx.export(_wrapper(model, sdpa=True), args, str(out / "decoder_model_merged.onnx"), dynamo=True,
                          input_names=inputs, output_names=outputs, dynamic_shapes=shapes, opset_version=opset,
                          external_data=False, optimize=True, verbose=False)
    return write_embeddings_and_config(model, out)


def dynamo_sdpa(zoo, family: str, opset: int) -> Path:
    """export_dynamo_sdpa's folder, made once into the zoo's cache (tests/conftest.py Zoo) under a key of this
    file."""
    import hashlib

    key = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    return zoo.made(f"family-{family}-dynamo-sdpa-opset{opset}-{key}",
                    lambda out: export_dynamo_sdpa(family, out, opset))

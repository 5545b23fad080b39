"""Traceable torch wrappers around `Qwen3ASRForConditionalGeneration` for ONNX export.

They reuse the model's own modules (weights, norms, rotary embedding) but spell attention out with
plain tensors, the way published exports do, so that both torch.onnx paths can trace them:
no DynamicCache, no data-dependent Python control flow.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

_NEG = -1e9  # finite mask value: finfo.min overflows to -inf/NaN once added in fp16 graphs


# ----------------------------------------------------------------------------- decoder


def _attend(q, k, v, mask, scaling, groups):
    """Eager attention with repeat_kv; q [B,h,S,d], k/v [B,kv,T,d], mask broadcastable to [B,h,S,T]."""
    if groups > 1:
        b, kv, t, d = k.shape
        k = k[:, :, None].expand(b, kv, groups, t, d).reshape(b, kv * groups, t, d)
        v = v[:, :, None].expand(b, kv, groups, t, d).reshape(b, kv * groups, t, d)
    scores = torch.matmul(q, k.transpose(2, 3)) * scaling
    if mask is not None:
        scores = scores + mask
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v).transpose(1, 2).contiguous()


def _decoder_layer(layer, x, cos, sin, mask, past_k, past_v):
    """One Qwen3 decoder layer; returns (x, keys, values) with keys/values incl. the past."""
    attn = layer.self_attn
    residual = x
    h = layer.input_layernorm(x)
    shape = (*h.shape[:-1], -1, attn.head_dim)
    q = attn.q_norm(attn.q_proj(h).view(shape)).transpose(1, 2)
    k = attn.k_norm(attn.k_proj(h).view(shape)).transpose(1, 2)
    v = attn.v_proj(h).view(shape).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    if past_k is not None:
        k = torch.cat([past_k, k], dim=2)
        v = torch.cat([past_v, v], dim=2)
    out = _attend(q, k, v, mask, attn.scaling, attn.num_key_value_groups)
    x = residual + attn.o_proj(out.reshape(*h.shape[:-1], -1))
    x = x + layer.mlp(layer.post_attention_layernorm(x))
    return x, k, v


def _causal_mask(q_len: torch.Tensor, past_len, dtype) -> torch.Tensor:
    """[1,1,S,P+S] additive mask: query i (at position P+i) sees keys 0..P+i."""
    q_pos = torch.arange(q_len, dtype=torch.int64).unsqueeze(1) + past_len
    k_pos = torch.arange(q_len + past_len, dtype=torch.int64).unsqueeze(0)
    return torch.where(k_pos <= q_pos, 0.0, _NEG).to(dtype)[None, None]


class _DecoderBody(nn.Module):
    def __init__(self, model):
        super().__init__()
        lm = model.model.language_model
        self.embed = lm.embed_tokens
        self.layers = lm.layers
        self.norm = lm.norm
        self.rotary = lm.rotary_emb
        self.lm_head = model.lm_head

    def run(self, x, position_ids, mask, pasts):
        cos, sin = self.rotary(x, position_ids)
        keys, values = [], []
        for i, layer in enumerate(self.layers):
            pk, pv = pasts[i] if pasts is not None else (None, None)
            x, k, v = _decoder_layer(layer, x, cos, sin, mask, pk, pv)
            keys.append(k)
            values.append(v)
        return self.lm_head(self.norm(x)), keys, values


class SplitDecoderInit(_DecoderBody):
    """Prefill: (input_ids, position_ids, audio_features, audio_offset) -> logits [B,S,V], stacked KV."""

    def forward(self, input_ids, position_ids, audio_features, audio_offset):
        emb = self.embed(input_ids)
        seq = torch.arange(input_ids.shape[1], dtype=torch.int64)
        rel = seq - audio_offset
        in_audio = (rel >= 0) & (rel < audio_features.shape[1])
        idx = rel.clamp(0, audio_features.shape[1] - 1)
        x = torch.where(in_audio[None, :, None], audio_features[:, idx], emb)
        mask = _causal_mask(input_ids.shape[1], 0, x.dtype)
        logits, keys, values = self.run(x, position_ids, mask, None)
        return logits, torch.stack(keys), torch.stack(values)


class SplitDecoderStep(_DecoderBody):
    """Step: (input_embeds [B,1,H], position_ids, past_keys/values [L,B,kv,P,d]) -> logits, stacked KV."""

    def forward(self, input_embeds, position_ids, past_keys, past_values):
        pasts = [(past_keys[i], past_values[i]) for i in range(len(self.layers))]
        logits, keys, values = self.run(input_embeds, position_ids, None, pasts)
        return logits, torch.stack(keys), torch.stack(values)


class MergedDecoder(_DecoderBody):
    """optimum/genai style: (inputs_embeds, attention_mask, *past) -> (logits, *present)."""

    def forward(self, inputs_embeds, attention_mask, *past):
        q_len = inputs_embeds.shape[1]
        past_len = attention_mask.shape[1] - q_len
        position_ids = (torch.arange(q_len, dtype=torch.int64) + past_len).unsqueeze(0)
        pad = torch.where(attention_mask[:, None, None, :] > 0, 0.0, _NEG).to(inputs_embeds.dtype)
        mask = _causal_mask(q_len, past_len, inputs_embeds.dtype) + pad
        pasts = [(past[2 * i], past[2 * i + 1]) for i in range(len(self.layers))]
        logits, keys, values = self.run(inputs_embeds, position_ids, mask, pasts)
        return (logits, *[t for kv in zip(keys, values) for t in kv])


# ----------------------------------------------------------------------------- encoder


def _floordiv(a, b):
    return torch.div(a, b, rounding_mode="floor")


def _token_count(t, chunk: int, per_chunk: int):
    """Audio tokens for `t` mel frames: full chunks give `per_chunk`, the tail chunk 3x stride-2 less."""
    full = _floordiv(t - 1, chunk)  # chunks before the last one (the last holds 1..chunk frames)
    tail = t - full * chunk
    for _ in range(3):
        tail = _floordiv(tail - 1, 2) + 1
    return full * per_chunk + tail


class Encoder(nn.Module):
    """mel [1,128,T] -> audio_features [1,A,H]: conv stack per 100-frame chunk, windowed attention,
    projector. Matches `Qwen3ASRModel.get_audio_features` for a single clip."""

    def __init__(self, model):
        super().__init__()
        self.tower = model.model.audio_tower
        self.projector = model.model.multi_modal_projector
        cfg = self.tower.config
        self.chunk = cfg.n_window * 2
        self.window_chunks = cfg.n_window_infer // self.chunk

    def _conv(self, mel):
        t = mel.shape[2]
        n_chunks = torch.div(t + self.chunk - 1, self.chunk, rounding_mode="floor")
        mel = F.pad(mel, (0, n_chunks * self.chunk - t))
        x = mel.reshape(mel.shape[1], n_chunks, self.chunk).transpose(0, 1).unsqueeze(1)
        tw = self.tower
        x = F.gelu(tw.conv2d3(F.gelu(tw.conv2d2(F.gelu(tw.conv2d1(x))))))
        c, f, steps = x.shape[1], x.shape[2], x.shape[3]
        x = tw.conv_out(x.permute(0, 3, 1, 2).reshape(n_chunks, steps, c * f))
        x = x + tw.positional_embedding.positional_embedding[:steps].to(x.dtype)
        # only the last chunk is partial, so the valid positions are the first A rows
        count = _token_count(t, self.chunk, steps)
        return x.reshape(-1, x.shape[-1])[:count], steps

    def _layer(self, layer, x, mask):
        attn = layer.self_attn
        h = layer.self_attn_layer_norm(x)
        split = (x.shape[0], attn.num_heads, -1)
        q = attn.q_proj(h).reshape(split).transpose(0, 1)
        k = attn.k_proj(h).reshape(split).transpose(0, 1)
        v = attn.v_proj(h).reshape(split).transpose(0, 1)
        scores = torch.matmul(q, k.transpose(1, 2)) * attn.scaling + mask
        out = torch.matmul(F.softmax(scores, dim=-1), v).transpose(0, 1).reshape(x.shape[0], -1)
        x = x + attn.out_proj(out)
        h = layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(x))))
        return x + h

    def forward(self, mel):
        x, steps = self._conv(mel)
        # attention windows span `window_chunks` full chunks (n_window_infer frames)
        win = torch.arange(x.shape[0], dtype=torch.int64) // (steps * self.window_chunks)
        mask = torch.where(win[:, None] == win[None, :], 0.0, _NEG).to(x.dtype)
        for layer in self.tower.layers:
            x = self._layer(layer, x, mask)
        return self.projector(self.tower.ln_post(x)).unsqueeze(0)

"""A batched training forward for Qwen3ASRForConditionalGeneration, same weights, same maths.

The upstream encoder packs every clip into one flat sequence and, without flash attention, runs
attention window by window in a Python loop, with a host sync per clip: with 128 clips a batch
that loop dominates the step. Here the clips stay in a padded [B, T, D] batch and the windows
become a block-diagonal attention mask, so each layer is one attention call.
`tests/test_train_model.py` checks that the logits equal the upstream forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100


def _attention(attn, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    b, t, _ = x.shape
    q, k, v = (p(x).view(b, t, attn.num_heads, -1).transpose(1, 2) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None], scale=attn.scaling)
    return attn.out_proj(out.transpose(1, 2).reshape(b, t, -1))


def _layer(layer, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    x = x + _attention(layer.self_attn, layer.self_attn_layer_norm(x), allowed)
    h = layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(x))))
    return x + h


def encode_audio(model, feats: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Projected audio embeddings of all clips, flat [sum of audio tokens, hidden], in the order
    the upstream encoder emits them, and the audio-token count of each clip."""
    enc = model.model.audio_tower
    b, n_mels, t_pad = feats.shape
    chunk = enc.n_window * 2
    n_chunks = t_pad // chunk
    x = feats.view(b, n_mels, n_chunks, chunk).permute(0, 2, 1, 3).reshape(b * n_chunks, 1, n_mels, chunk)
    for conv in (enc.conv2d1, enc.conv2d2, enc.conv2d3):
        x = F.gelu(conv(x))
    _, ch, freq, steps = x.shape
    x = enc.conv_out(x.permute(0, 3, 1, 2).reshape(b * n_chunks, steps, ch * freq))
    x = x + enc.positional_embedding.positional_embedding[:steps].to(x.dtype)
    chunk_tokens = enc._post_cnn_length(mask.view(b, n_chunks, chunk).sum(-1))  # [b, n_chunks]
    valid = (torch.arange(steps, device=x.device) < chunk_tokens[..., None]).reshape(b, n_chunks * steps)
    x = x.reshape(b, n_chunks * steps, -1)
    # Attention windows: n_window_infer frames = (n_window_infer // chunk) full chunks of tokens.
    window = torch.arange(n_chunks * steps, device=x.device) // (steps * (enc.n_window_infer // chunk))
    allowed = (window[:, None] == window[None, :]) & valid[:, None, :]
    allowed = allowed | torch.eye(n_chunks * steps, dtype=torch.bool, device=x.device)  # no empty rows
    for layer in enc.layers:
        x = _layer(layer, x, allowed)
    x = enc.ln_post(x)
    return model.model.multi_modal_projector(x[valid]), valid.sum(-1)


def ctc_loss(model, audio: torch.Tensor, counts: torch.Tensor, targets: list[list[int]], blank: int):
    """CTC of the transcript tokens on the audio embeddings, read out through the tied lm_head.

    Trained from scratch, the decoder first learns to recite training sentences from their first
    words and ignores the audio (teacher-forced loss falls, greedy WER stays ~100%). This auxiliary
    loss makes every audio embedding name the token being spoken, in the decoder's own embedding
    space, which gives the decoder something it can copy. It adds no parameters.
    """
    logp = F.log_softmax(model.lm_head(audio).float(), dim=-1)
    per_clip = torch.nn.utils.rnn.pad_sequence(list(logp.split(counts.tolist())))  # [T, B, V]
    flat = torch.tensor([t for row in targets for t in row], device=audio.device)
    lengths = torch.tensor([len(row) for row in targets], device=audio.device)
    return F.ctc_loss(per_clip, flat, counts, lengths, blank=blank, zero_infinity=True)


def logits_and_loss(model, ids, attention_mask, feats, mask, labels=None, audio=None):
    """(logits of the labelled positions' predecessors or of all positions, mean loss or None).
    `audio` takes embeddings already computed by `encode_audio`."""
    embed = model.model.get_input_embeddings()
    inputs = embed(ids)
    audio = encode_audio(model, feats, mask)[0] if audio is None else audio
    slots = (ids == model.config.audio_token_id)[..., None].expand_as(inputs)
    inputs = inputs.masked_scatter(slots, audio.to(inputs.dtype))
    hidden = model.model.language_model(inputs_embeds=inputs, attention_mask=attention_mask).last_hidden_state
    if labels is None:
        return model.lm_head(hidden), None
    target = labels[:, 1:]
    keep = target != IGNORE
    logits = model.lm_head(hidden[:, :-1][keep])  # only positions that predict an answer token
    return logits, F.cross_entropy(logits.float(), target[keep])

"""Check exported graphs against the torch model with onnxruntime before they are published."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import torch.nn.functional as F

from webbuild import layouts
from webbuild.graph import cpu_session as cpu
from webbuild.layouts import Decoder
from webbuild.reference.prompt import audio_token_count, build_prompt
from webbuild.zoo.onnx_export import as_numpy


class ExportCheckError(RuntimeError):
    pass


def assert_close(what: str, got: np.ndarray, want: np.ndarray, tol: float = 1e-3) -> None:
    """Relative to the reference's scale: random 0.6b logits are large, tiny ones small."""
    if got.shape != want.shape:
        raise ExportCheckError(f"{what}: shape {got.shape} != torch {want.shape}")
    err = float(np.abs(got - want).max())
    scale = max(1.0, float(np.abs(want).max()))
    if not err <= tol * scale:
        raise ExportCheckError(f"{what}: max |onnx - torch| = {err:.3g} exceeds {tol * scale:.3g}")


def torch_reference(model, mel: torch.Tensor, ids: list[int]):
    """Audio features and full-sequence logits from the upstream model's own forward."""
    t = mel.shape[2]
    padded = (t + 99) // 100 * 100
    mask = torch.zeros(1, padded, dtype=torch.int64)
    mask[:, :t] = 1
    mel = F.pad(mel, (0, padded - t))
    with torch.no_grad():
        audio = model.get_audio_features(mel, mask, return_dict=True).pooler_output
        logits = model(input_ids=torch.tensor([ids]), input_features=mel, input_features_mask=mask).logits
    return as_numpy(audio)[None], as_numpy(logits)


def cpu_session(path: Path) -> ort.InferenceSession:
    """An onnxruntime CPU session that reads the weights in place: without prepacking, external
    data stays memory-mapped (file pages the kernel can drop) instead of being copied into packed
    buffers beside the torch model that is still in memory."""
    return cpu.session(str(path), cpu.options({"session.disable_prepacking": "1"}))


CHECK_FRAMES = 412  # differs from the tracing input, so baked-in shapes fail the check


def check_export(stage: Path, layout: str, model, tok) -> None:
    """The graphs of the export in `stage`, in `layout` (a name of webbuild.layouts), against `model`'s
    audio features and logits on a clip whose length differs from the tracing input's."""
    check_decoder = DECODER_CHECKS[layouts.layout(layout, "layout").decoder]
    mel = torch.randn(1, 128, CHECK_FRAMES, generator=torch.Generator().manual_seed(1))
    prompt = build_prompt(tok, audio_token_count(CHECK_FRAMES))
    audio_ref, logits_ref = torch_reference(model, mel, prompt.ids)
    audio = cpu_session(stage / "encoder.onnx").run(None, {"mel": as_numpy(mel)})[0]
    assert_close("encoder audio_features", audio, audio_ref)
    nxt = int(logits_ref[0, -1].argmax())
    _, logits2_ref = torch_reference(model, mel, prompt.ids + [nxt])
    embed = as_numpy(model.model.language_model.embed_tokens.weight)
    check_decoder(stage, model, prompt, audio_ref, logits_ref, logits2_ref, embed, nxt)


def _check_split(stage, model, prompt, audio, logits_ref, logits2_ref, embed, nxt):
    next_embed = embed[[nxt]][None]
    n = len(prompt.ids)
    logits, keys, values = cpu_session(stage / "decoder_init.onnx").run(None, {
        "input_ids": np.array([prompt.ids], dtype=np.int64),
        "position_ids": np.arange(n, dtype=np.int64)[None],
        "audio_features": audio,
        "audio_offset": np.array([prompt.audio_offset], dtype=np.int64),
    })
    assert_close("decoder_init logits", logits, logits_ref)
    step = cpu_session(stage / "decoder_step.onnx").run(None, {
        "input_embeds": next_embed.astype(np.float32), "position_ids": np.array([[n]], dtype=np.int64),
        "past_keys": keys, "past_values": values})
    assert_close("decoder_step logits", step[0][:, -1], logits2_ref[:, -1])


def _check_merged(stage, model, prompt, audio, logits_ref, logits2_ref, embed, nxt):
    sess = cpu_session(stage / "decoder_model_merged.onnx")
    text = model.config.text_config
    x = embed[prompt.ids][None].copy()
    x[0, prompt.audio_offset:prompt.audio_offset + prompt.audio_tokens] = audio[0]
    empty = np.zeros((1, text.num_key_value_heads, 0, text.head_dim), dtype=np.float32)
    past = {i.name: empty for i in sess.get_inputs()[2:]}
    n = len(prompt.ids)
    out = sess.run(None, {"inputs_embeds": x, "attention_mask": np.ones((1, n), np.int64), **past})
    assert_close("merged prefill logits", out[0], logits_ref)
    present = dict(zip([i.name for i in sess.get_inputs()[2:]], out[1:]))
    out = sess.run(None, {"inputs_embeds": embed[[nxt]][None], "attention_mask": np.ones((1, n + 1), np.int64),
                          **present})
    assert_close("merged step logits", out[0][:, -1], logits2_ref[:, -1])


DECODER_CHECKS = {Decoder.SPLIT: _check_split, Decoder.MERGED: _check_merged}  # the decoders the zoo writes

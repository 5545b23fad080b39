"""Write a Qwen3-ASR torch model as ONNX in the layouts people publish, checked against torch first.

Layouts (webbuild.layouts.ZOO_LAYOUTS):
- `qwen3-asr-split` (andrewleech/qwen3-asr-onnx): encoder.onnx, decoder_init.onnx, decoder_step.onnx sharing
  decoder_weights.data, embed_tokens.bin, config.json, preprocessor_config.json, tokenizer.json.
- `merged` (optimum / transformers.js / genai style): encoder.onnx, decoder_model_merged.onnx
  (+ .onnx.data) taking inputs_embeds, attention_mask, past_key_values.{i}.key|value; same side files.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from webbuild import layouts
from webbuild.errors import ZooError
from webbuild.layouts import Decoder
from webbuild.reference.prompt import audio_token_count, build_prompt
from webbuild.reference.tokenizer import special_ids
from webbuild.site.contract import IO
from webbuild.zoo import export_check, wrappers
from webbuild.zoo.onnx_export import SharedWeights, as_numpy, export_file, save_inline_file

LAYOUTS = tuple(entry.name for entry in layouts.ZOO_LAYOUTS)
log = logging.getLogger(__name__)

SAMPLE_FRAMES = 237  # mel frames of the tracing/check input: 2 full chunks + a partial one


def export_model(model, tok: Tokenizer, out_dir: Path, layout: str = layouts.SPLIT.name,
                 exporter: str = "torchscript") -> None:
    """Export `model` into `out_dir` (created; must not exist) in `layout` (a name of webbuild.layouts).
    Nothing is left behind on failure."""
    entry = layouts.layout(layout, "layout")
    if entry not in layouts.ZOO_LAYOUTS:
        raise ZooError(f"the zoo writes the layouts {', '.join(LAYOUTS)}, not {entry.name}")
    out_dir = Path(out_dir)
    check_new_folder(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    model = model.eval().float()
    with tempfile.TemporaryDirectory(prefix=".zoo-", dir=out_dir.parent) as tmp:
        stage = Path(tmp) / "out"
        stage.mkdir()
        samples = sample_inputs(model, tok)
        export_encoder(model, samples, stage, exporter)
        DECODER_EXPORTS[entry.decoder](model, samples, stage, exporter)
        _write_side_files(model, tok, stage)
        log.info("checking the ONNX graphs against torch")
        export_check.check_export(stage, entry.name, model, tok)
        stage.rename(out_dir)
    log.info(f"wrote {out_dir}")


def check_new_folder(out_dir: Path) -> None:
    """An export never overwrites: `out_dir` must not exist yet."""
    if Path(out_dir).exists():
        raise ZooError(f"{out_dir} already exists; choose a new output folder")


def sample_inputs(model, tok) -> dict:
    gen = torch.Generator().manual_seed(0)
    mel = torch.randn(1, 128, SAMPLE_FRAMES, generator=gen)
    prompt = build_prompt(tok, audio_token_count(SAMPLE_FRAMES))
    return {"mel": mel, "prompt": prompt}


def _scratch(stage: Path) -> tempfile.TemporaryDirectory:
    """A folder for one exporter's raw output, beside the stage (same disk; removed with it on failure)."""
    return tempfile.TemporaryDirectory(prefix="graph-", dir=stage.parent)


def export_encoder(model, samples, stage: Path, exporter: str) -> None:
    log.info(f"exporting encoder ({exporter})")
    with _scratch(stage) as tmp:
        src = export_file(wrappers.Encoder(model), (samples["mel"],), exporter, ["mel"], ["audio_features"],
                          {"mel": {2: "frames"}, "audio_features": {1: "audio_len"}}, Path(tmp) / "model.onnx")
        save_inline_file(src, stage / "encoder.onnx")


def _export_sharing(shared: SharedWeights, dst: Path, module, args, exporter: str, inputs, outputs, dynamic) -> None:
    """Export one graph to a scratch folder, move its weights into `shared`, drop the scratch copy:
    one graph's weights on disk at a time, none of them in memory."""
    with _scratch(dst.parent) as tmp:
        src = export_file(module, args, exporter, inputs, outputs, dynamic, Path(tmp) / "model.onnx")
        shared.add_file(src, dst)


def _init_args(model, samples):
    ids = torch.tensor([samples["prompt"].ids])
    with torch.no_grad():
        audio = wrappers.Encoder(model)(samples["mel"])
    return ids, torch.arange(ids.shape[1])[None], audio, torch.tensor([samples["prompt"].audio_offset])


SPLIT_INIT_IO = (
    ["input_ids", "position_ids", "audio_features", "audio_offset"],
    ["logits", "present_keys", "present_values"],
    {"input_ids": {0: "batch", 1: "seq_len"}, "position_ids": {0: "batch", 1: "seq_len"},
     "audio_features": {0: "batch", 1: "audio_len"}, "logits": {0: "batch", 1: "seq_len"},
     "present_keys": {1: "batch", 3: "seq_len"}, "present_values": {1: "batch", 3: "seq_len"}},
)
SPLIT_STEP_IO = (
    ["input_embeds", "position_ids", "past_keys", "past_values"],
    ["logits", "present_keys", "present_values"],
    {"input_embeds": {0: "batch"}, "position_ids": {0: "batch"},
     "past_keys": {1: "batch", 3: "past_seq_len"}, "past_values": {1: "batch", 3: "past_seq_len"},
     "logits": {0: "batch"}, "present_keys": {1: "batch", 3: "total_seq_len"},
     "present_values": {1: "batch", 3: "total_seq_len"}},
)


def _export_split_decoder(model, samples, stage: Path, exporter: str) -> None:
    text = model.config.text_config
    with SharedWeights(stage / "decoder_weights.data") as data:
        log.info(f"exporting decoder_init ({exporter})")
        _export_sharing(data, stage / "decoder_init.onnx", wrappers.SplitDecoderInit(model),
                        _init_args(model, samples), exporter, *SPLIT_INIT_IO)
        log.info(f"exporting decoder_step ({exporter})")
        past = torch.randn(text.num_hidden_layers, 1, text.num_key_value_heads, 20, text.head_dim)
        step_args = (torch.randn(1, 1, text.hidden_size), torch.tensor([[20]]), past, past.clone())
        _export_sharing(data, stage / "decoder_step.onnx", wrappers.SplitDecoderStep(model), step_args, exporter,
                        *SPLIT_STEP_IO)


def _export_merged_decoder(model, samples, stage: Path, exporter: str) -> None:
    text = model.config.text_config
    log.info(f"exporting decoder_model_merged ({exporter})")
    inputs, outputs = IO.decoder(text.num_hidden_layers)  # the built decoder's own interface
    past_len, q_len = 20, 3
    kv = [torch.randn(1, text.num_key_value_heads, past_len, text.head_dim) for _ in inputs[2:]]
    args = (torch.randn(1, q_len, text.hidden_size), torch.ones(1, past_len + q_len, dtype=torch.int64), *kv)
    dynamic = {IO.inputs_embeds: {0: "batch", 1: "seq_len"}, IO.attention_mask: {0: "batch", 1: "total_seq_len"},
               IO.logits: {0: "batch", 1: "seq_len"}}
    dynamic.update({n: {0: "batch", 2: "past_seq_len"} for n in inputs[2:]})
    dynamic.update({n: {0: "batch", 2: "total_seq_len"} for n in outputs[1:]})
    with SharedWeights(stage / "decoder_model_merged.onnx.data") as data:
        _export_sharing(data, stage / "decoder_model_merged.onnx", wrappers.MergedDecoder(model), args, exporter,
                        inputs, outputs, dynamic)


DECODER_EXPORTS = {Decoder.SPLIT: _export_split_decoder, Decoder.MERGED: _export_merged_decoder}


def _write_side_files(model, tok: Tokenizer, stage: Path) -> None:
    embed = as_numpy(model.model.language_model.embed_tokens.weight).astype(np.float32, copy=False)
    embed.tofile(stage / "embed_tokens.bin")
    tok.save(str(stage / "tokenizer.json"))
    (stage / "config.json").write_text(json.dumps(split_config(model, tok, embed.shape), indent=2) + "\n")
    (stage / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2) + "\n")


PREPROCESSOR_CONFIG = {
    "feature_extractor_type": "WhisperFeatureExtractor",
    "feature_size": 128,
    "sampling_rate": 16000,
    "hop_length": 160,
    "n_fft": 400,
    "chunk_length": 30,
    "n_samples": 480000,
    "nb_max_frames": 3000,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": False,
}


def split_config(model, tok: Tokenizer, embed_shape) -> dict:
    """config.json in the published export's shape (encoder/decoder/mel/special_tokens blocks)."""
    audio, text = model.config.audio_config, model.config.text_config
    ids = special_ids(tok)
    return {
        "model_type": "qwen3_asr",
        "encoder": {
            "num_layers": audio.encoder_layers, "hidden_size": audio.d_model,
            "num_heads": audio.encoder_attention_heads, "ffn_dim": audio.encoder_ffn_dim,
            "conv_channels": audio.downsample_hidden_size, "output_dim": audio.output_dim,
            "downsample_factor": 8, "num_mel_bins": audio.num_mel_bins,
        },
        "decoder": {
            "num_layers": text.num_hidden_layers, "hidden_size": text.hidden_size,
            "num_attention_heads": text.num_attention_heads, "num_key_value_heads": text.num_key_value_heads,
            "head_dim": text.head_dim, "intermediate_size": text.intermediate_size,
            "vocab_size": text.vocab_size, "rope_theta": text.rope_parameters["rope_theta"],
            "rms_norm_eps": text.rms_norm_eps, "tie_word_embeddings": bool(model.config.tie_word_embeddings),
            "max_position_embeddings": text.max_position_embeddings,
        },
        "embed_tokens_shape": list(embed_shape),
        "embed_tokens_dtype": "float32",
        "mel": {"sample_rate": 16000, "n_fft": 400, "hop_length": 160, "n_mels": 128, "fmin": 0, "fmax": 8000},
        "special_tokens": {
            "eos_token_ids": [ids["<|endoftext|>"], ids["<|im_end|>"]],
            "pad_token_id": ids["<|endoftext|>"],
            "im_start_token_id": ids["<|im_start|>"],
            "im_end_token_id": ids["<|im_end|>"],
            "audio_start_token_id": ids["<|audio_start|>"],
            "audio_end_token_id": ids["<|audio_end|>"],
            "audio_pad_token_id": ids["<|audio_pad|>"],
            "asr_text_token_id": ids["<asr_text>"],
        },
    }

"""Entry point for the build: one quantized decoder, written as fp16 / fp32 variants, plus encoders.

Input folder: a decoder graph (`decoder.onnx` from fusion, else `decoder_model_merged.onnx`) taking
`inputs_embeds`, with `encoder.onnx`, `embed_tokens.bin` and `config.json` beside it.

Files written to `out_dir`, per variant v in `variants` (fp16 | fp32):
  decoder.<v>.onnx + decoder.<v>.onnx.data   inputs: input_ids [B,S] int64, audio_features [B,A,H] <v float>,
                                             audio_offset [1] int64, attention_mask [B,T] int64,
                                             past_key_values.{i}.key|value <v float>;
                                             outputs: logits, present.{i}.key|value <v float>
  encoder.<v>.onnx (+ .data when large)      input as the source (pcm or mel, fp32 always);
                                             output audio_features <v float>; weights at `encoder_precision`
The decoder's weights are MatMulNBits (settings from model.yaml `quantize:`), its embeddings an int4
GatherBlockQuantized lookup (tied: lm_head's own weight; see embeddings.py); no float table is written.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import onnx
from onnx.external_data_helper import load_external_data_for_model

from webbuild.config import Quantize
from webbuild.errors import SourceError
from webbuild.graph.census import op_census
from webbuild.graph.load import load_onnx
from webbuild.quantize.embeddings import add_input_ids
from webbuild.quantize.encoder import encoder_variant
from webbuild.quantize.lazy import load_deferred, load_lazily
from webbuild.quantize.precision import to_fp16
from webbuild.quantize.quantize_matmuls import quantize_matmuls
from webbuild.quantize.requantize import requantize
from webbuild.site import contract

DECODER_SOURCES = ("decoder.onnx", "decoder_model_merged.onnx")
VARIANTS = tuple(contract.VARIANTS)  # the precision variants a build can ship
EXTERNAL_MIN_BYTES = 1024
# The encoder runs once per clip, so int8 activations (accuracy level 4) buy little there, and they
# make runtimes disagree: onnxruntime CPU uses int8 kernels, onnxruntime-web's wasm computes in fp32,
# which flipped a word of a held-out clip between the browser and the Python reference (measured).
ENCODER_ACCURACY_LEVEL = 0


def decoder_source(model_dir: Path) -> Path:
    for name in DECODER_SOURCES:
        if (Path(model_dir) / name).is_file():
            return Path(model_dir) / name
    raise SourceError(f"{model_dir}: none of {', '.join(DECODER_SOURCES)}")


def embed_table(model_dir: Path) -> tuple[np.ndarray, dict]:
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    shape = cfg.get("embed_tokens_shape") or [cfg["decoder"]["vocab_size"], cfg["decoder"]["hidden_size"]]
    dtype = np.dtype(cfg.get("embed_tokens_dtype", "float32"))
    table = np.fromfile(Path(model_dir) / "embed_tokens.bin", dtype).reshape(shape).astype(np.float32, copy=False)
    return table, cfg


def save_model(model: onnx.ModelProto, path: Path) -> int:
    """Write `path` (+ `path.data` for the weights); returns the bytes on disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in (path, path.with_name(path.name + ".data")):
        old.unlink(missing_ok=True)
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location=path.name + ".data", size_threshold=EXTERNAL_MIN_BYTES)
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + ".data")) if p.exists())


def quantized_decoder(model_dir: Path, s: Quantize) -> tuple[onnx.ModelProto, dict]:
    """The fp32 decoder of `model_dir` with MatMulNBits weights and the input_ids lookup; its float
    MatMul weights are read one at a time as they are quantized (webbuild.quantize.lazy)."""
    src = decoder_source(model_dir)
    table, cfg = embed_table(model_dir)
    model, report = quantize_decoder(load_lazily(src), table, cfg, s)
    return model, {"source": src.name, **report}


def quantize_decoder(model: onnx.ModelProto, table: np.ndarray, cfg: dict,
                     s: Quantize) -> tuple[onnx.ModelProto, dict]:
    """MatMulNBits weights and the int4 input_ids lookup (`table`: the float embeddings, `cfg`: the
    source's config.json) for a decoder taking inputs_embeds; returns (model, report)."""
    report: dict = {"requantized": requantize(model, s) if s.method != "none" else []}
    model = quantize_matmuls(model, s)
    load_deferred(model)  # weights the quantizer left as they were (excluded, method none)
    tied = cfg.get("decoder", {}).get("tie_word_embeddings")
    report["embeddings"] = add_input_ids(model, table, bits=4, block_size=s.block_size, tied=None if tied else False)
    return model, report


def quantize_variants(model_dir: Path, out_dir: Path, quantize: Quantize | None = None, variants=VARIANTS,
                      encoder_precision: str = "fp32") -> dict:
    """Write every variant's decoder and encoder into `out_dir`; returns the report (see module doc).
    `quantize`: model.yaml's settings, its defaults when None."""
    s = quantize or Quantize()
    out_dir = Path(out_dir)
    start = time.monotonic()
    decoder, report = quantized_decoder(Path(model_dir), s)
    report.update(settings=s.model_dump(), encoder_precision=encoder_precision, variants={})
    for v in variants:
        if v not in VARIANTS:
            raise ValueError(f"variant {v!r}: expected one of {', '.join(VARIANTS)}")
    report["variants"] = dict.fromkeys(variants)  # in model.yaml's order
    # float32 variants first: the fp16 decoder is then converted in place, never beside a copy of the fp32 one
    saved = False
    for v in sorted(variants, key=lambda v: contract.VARIANTS[v]["dtype"] == "float16"):
        if contract.VARIANTS[v]["dtype"] == "float16":
            if saved:  # onnx.save moved the weights out to the file it wrote: read them back from it
                load_external_data_for_model(decoder, str(out_dir))
            decoder = to_fp16(decoder)
        # loaded per variant rather than copied: one float encoder in memory at a time
        enc = encoder_variant(load_onnx(Path(model_dir) / "encoder.onnx", external_data=True), encoder_precision, v,
                              ENCODER_ACCURACY_LEVEL)
        report["variants"][v] = {
            "decoder": {"file": f"decoder.{v}.onnx", "bytes": save_model(decoder, out_dir / f"decoder.{v}.onnx"),
                        "ops": op_census(decoder)},
            "encoder": {"file": f"encoder.{v}.onnx", "bytes": save_model(enc, out_dir / f"encoder.{v}.onnx")},
        }
        del enc
        saved = True
    report["seconds"] = round(time.monotonic() - start, 2)
    return report

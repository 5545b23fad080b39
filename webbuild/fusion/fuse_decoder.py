"""Driver: a decoder export (a source folder or a decoder .onnx) -> one fused decoder graph + a report.

Order matters: norms first (GQA looks for Q/K norms as SimplifiedLayerNormalization), then the
residual Skip fold, attention, the split->single-graph interface, packing, lm_head pruning.
The flags that turn steps on are read once, from the source and the options, before the first step.
Every step leaves a valid graph; a pattern a rule does not recognise stays as it was and the
report says where and why.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx_ir as ir

from webbuild import layouts
from webbuild.errors import SourceError
from webbuild.fusion import (
    cleanup,
    dequant,
    gather_block_quantized,
    gqa,
    layer_norm,
    matmul_nbits,
    merge_split,
    packed_qkv,
    prune_lm_head,
    qk_norm_in_gqa,
    rms_norm,
    rms_normalization,
    skip_layer_norm,
    skip_rms_norm,
    static_cache,
    static_reshape,
)
from webbuild.fusion.rule import Step, fuse_graph


def decoder_path(src: Path) -> Path:
    """The decoder graph to fuse: a source folder's prefill graph (its layout told by its files,
    webbuild.layouts.detect), or the .onnx file itself."""
    src = Path(src)
    if not src.is_dir():
        if not src.is_file():
            raise SourceError(f"{src}: not found; give a source folder or a decoder .onnx")
        return src
    layout = layouts.detect(src)
    if layout is None:
        raise SourceError(f"{src}: found none of {layouts.detect_hint()}; give a source folder or a decoder .onnx")
    return src / layout.prefill


def load_source(src: Path) -> tuple[ir.Model, dict]:
    """(decoder graph to fuse, decoder config or {}) for a source folder or a decoder .onnx file."""
    src, path = Path(src), decoder_path(src)
    cfg_path = (src if src.is_dir() else src.parent) / "config.json"
    data = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    cfg = data.get("decoder", data)  # the zoo's section, or a Hugging Face config beside an Optimum export
    return ir.load(path), cfg


def fuse_decoder(src: Path | ir.Model, max_positions: int | None = None,
                 prune_lm_head_: bool = True, pack_qkv: bool = True,
                 qk_norm: str = "explicit", min_positions: int = 0) -> tuple[ir.Model, dict]:
    """Fuse a decoder; returns (model, report dict with census before/after, what was not fused, and
    `static_kv`: the past inputs the source writes in place, a static KV cache, webbuild.fusion.static_cache).

    qk_norm: "explicit" keeps Qwen3's Q/K norms as SimplifiedLayerNormalization (runs everywhere);
    "gqa" moves them into GroupQueryAttention (WebGPU/CUDA only, as the genai builder's webgpu graph).
    min_positions: GQA's cos/sin caches hold at least this many positions where the model's maximum is known
    (what one chunk of long audio reaches)."""
    if qk_norm not in ("explicit", "gqa"):
        raise ValueError(f"qk_norm must be 'explicit' or 'gqa', not {qk_norm!r}")
    model, cfg = (src, {}) if isinstance(src, ir.Model) else load_source(src)
    flags = {"quantized_weights": dequant.has_dequantized(model),
             "decomposed": cleanup.needs_fusion(model), "split_init": merge_split.is_split_init(model),
             "pack_qkv": pack_qkv, "qk_norm_in_gqa": qk_norm == "gqa", "prune_lm_head": prune_lm_head_}
    known = max_positions or cfg.get("max_position_embeddings")
    steps = decoder_steps(max(known, min_positions) if known else None)
    static = static_cache.buffers(model.graph)  # read before the rules rewrite the writes
    return model, {**fuse_graph(model, steps, flags), "static_kv": static}


def decoder_steps(max_positions: int | None) -> tuple[Step, ...]:
    """The decoder's rules in order, each under the flag (read from the source and the options) that
    turns it on."""
    return (
        # before cleanup folds the weights to float; the lookup first, so a tied lm_head finds its table packed
        Step(gather_block_quantized.RULE, when="quantized_weights"),
        Step(matmul_nbits.RULE, when="quantized_weights"),
        Step(cleanup.apply, when="decomposed"),
        Step(layer_norm.RULE, when="decomposed"),  # first: a LayerNorm's centred part is an RMSNorm too
        Step(rms_norm.RULE, when="decomposed"),
        Step(rms_normalization.RULE),  # opset 23's standard op, in graphs with nothing else to fold
        Step(skip_rms_norm.RULE, when="decomposed"),
        Step(skip_layer_norm.RULE, when="decomposed"),
        Step(gqa.rule(max_positions), when="decomposed"),
        Step(merge_split.RULE, when="split_init"),
        Step(packed_qkv.RULE, when="pack_qkv"),
        Step(qk_norm_in_gqa.RULE, when="qk_norm_in_gqa"),
        Step(prune_lm_head.rule(), when="prune_lm_head"),
        Step(static_reshape.RULE),
    )


def save(model: ir.Model, out_dir: Path, name: str = "decoder.onnx") -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    ir.save(model, path, external_data=f"{name}.data")
    return path

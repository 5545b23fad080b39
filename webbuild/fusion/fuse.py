"""Driver: a decoder export (split dir or merged .onnx) -> one fused decoder graph + a report.

Order matters: norms first (GQA looks for Q/K norms as SimplifiedLayerNormalization), then the
residual Skip fold, attention, the split->single-graph interface, packing, lm_head pruning.
Every step leaves a valid graph; a pattern a rule does not recognise stays as it was and the
report says where and why.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx_ir as ir

from webbuild.fusion import cleanup, gqa, matmul_nbits, merge_split, packed_qkv, prune_lm_head, qk_norm_in_gqa, rms_norm, skip_rms_norm, static_reshape
from webbuild.graph.ir import census, dead_code_elimination
from webbuild.fusion.report import Report

SPLIT_INIT = "decoder_init.onnx"


def load_source(src: Path) -> tuple[ir.Model, dict]:
    """(decoder graph to fuse, decoder config or {}) for a split dir or a merged .onnx file."""
    src = Path(src)
    path = src / SPLIT_INIT if src.is_dir() else src
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found; give a split-layout folder or a merged decoder .onnx")
    cfg_path = (src if src.is_dir() else src.parent) / "config.json"
    cfg = json.loads(cfg_path.read_text()).get("decoder", {}) if cfg_path.is_file() else {}
    return ir.load(path), cfg


def fuse_decoder(src: Path | ir.Model, max_positions: int | None = None,
                 prune_lm_head_: bool = True, pack_qkv: bool = True,
                 qk_norm: str = "explicit") -> tuple[ir.Model, dict]:
    """Fuse a decoder; returns (model, report dict with census before/after and what was not fused).

    qk_norm: "explicit" keeps Qwen3's Q/K norms as SimplifiedLayerNormalization (runs everywhere);
    "gqa" moves them into GroupQueryAttention (WebGPU/CUDA only, as the genai builder's webgpu graph)."""
    if qk_norm not in ("explicit", "gqa"):
        raise ValueError(f"qk_norm must be 'explicit' or 'gqa', not {qk_norm!r}")
    model, cfg = (src, {}) if isinstance(src, ir.Model) else load_source(src)
    max_positions = max_positions or cfg.get("max_position_embeddings")
    report = Report()
    before = census(model)
    if any(n.op_type == "DequantizeLinear" for n in model.graph):
        _run(model, matmul_nbits.apply, report)  # before cleanup folds the weights to float
    if cleanup.needs_fusion(model):
        cleanup.apply(model)
        _run(model, rms_norm.apply, report)
        _run(model, skip_rms_norm.apply, report)
        _run(model, lambda m, r: gqa.apply(m, r, max_positions), report)
    if merge_split.is_split_init(model):
        _run(model, merge_split.apply, report)
    if pack_qkv:
        _run(model, packed_qkv.apply, report)
    if qk_norm == "gqa":
        _run(model, qk_norm_in_gqa.apply, report)
    if prune_lm_head_:
        _run(model, prune_lm_head.apply, report)
    _run(model, static_reshape.apply, report)
    if report.fused:
        cleanup.apply(model)  # fold what the rewrites left constant (e.g. a tied weight's Transpose)
    out = report.as_dict()
    out.update(nodes_before=sum(before.values()), nodes_after=len(model.graph),
               ops_before=before, ops_after=census(model))
    return model, out


def _run(model: ir.Model, rule, report: Report) -> None:
    rule(model, report)
    dead_code_elimination(model)


def save(model: ir.Model, out_dir: Path, name: str = "decoder.onnx") -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    ir.save(model, path, external_data=f"{name}.data")
    return path

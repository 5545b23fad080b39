"""Driver: an audio encoder graph (`mel` -> `audio_features`) -> the same graph with fused operators
(LayerNormalization, SkipLayerNormalization, Gelu / BiasGelu, MultiHeadAttention fed by one packed
QKV projection) + a report.

Order matters: decomposed LayerNorms first (the Skip fold looks for LayerNormalization), Gelu before
BiasGelu, then the residual Skip fold (which also takes the projections' biases), attention, and
the packing of attention's projections.
Every step leaves a valid graph; a pattern a rule does not recognise stays as it was and the report
says where and why. A graph with nothing decomposed (already fused) is returned untouched. The ops
emitted all have kernels in onnxruntime CPU, onnxruntime-web's WebGPU EP and its wasm EP.
"""

from __future__ import annotations

from pathlib import Path

import onnx_ir as ir

from webbuild.fusion import bias_gelu, cleanup, encoder_attention, encoder_packed_qkv, gelu, layer_norm, skip_layer_norm
from webbuild.graph.ir import census, dead_code_elimination
from webbuild.fusion.report import Report

ENCODER = "encoder.onnx"
ANCHORS = {"Erf", "Softmax", "ReduceMean"}
RULES = (layer_norm.apply, gelu.apply, bias_gelu.apply, skip_layer_norm.apply, encoder_attention.apply,
         encoder_packed_qkv.apply)


def load_encoder(src: Path) -> ir.Model:
    """The encoder of a source folder (its encoder.onnx) or an encoder .onnx file."""
    src = Path(src)
    path = src / ENCODER if src.is_dir() else src
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found; give a source folder with {ENCODER} or an encoder .onnx")
    return ir.load(path)


def needs_fusion(model: ir.Model) -> bool:
    """Something decomposed to fuse: an anchor op, or a residual Add feeding a LayerNormalization."""
    return any(n.op_type in ANCHORS for n in model.graph) or any(
        n.op_type == "LayerNormalization" and n.domain == "" and n.inputs[0].producer() is not None
        and n.inputs[0].producer().op_type == "Add" for n in model.graph)


def fuse_encoder(src: Path | ir.Model) -> tuple[ir.Model, dict]:
    """Fuse an encoder; returns (model, report dict with census before/after and what was not fused)."""
    model = src if isinstance(src, ir.Model) else load_encoder(src)
    report = Report()
    before = census(model)
    if needs_fusion(model):
        cleanup.apply(model)
        for rule in RULES:
            rule(model, report)
            dead_code_elimination(model)
        if report.fused:
            cleanup.apply(model)  # fold what the rewrites left constant
    out = report.as_dict()
    out.update(nodes_before=sum(before.values()), nodes_after=len(model.graph),
               ops_before=before, ops_after=census(model))
    return model, out

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

from webbuild.errors import SourceError
from webbuild.fusion import bias_gelu, cleanup, encoder_attention, encoder_packed_qkv, gelu, layer_norm, skip_layer_norm
from webbuild.fusion.rule import Step, fuse_graph
from webbuild.graph.ir import prod

ENCODER = "encoder.onnx"
ANCHORS = {"Erf", "Softmax", "ReduceMean"}
# the encoder's rules in order, all under one flag: a graph with nothing decomposed is left untouched
STEPS = (
    Step(cleanup.apply, when="decomposed"),
    Step(layer_norm.RULE, when="decomposed"),
    Step(gelu.RULE, when="decomposed"),
    Step(bias_gelu.RULE, when="decomposed"),
    Step(skip_layer_norm.RULE, when="decomposed"),
    Step(encoder_attention.RULE, when="decomposed"),
    Step(encoder_packed_qkv.RULE, when="decomposed"),
)


def load_encoder(src: Path) -> ir.Model:
    """The encoder of a source folder (its encoder.onnx) or an encoder .onnx file."""
    src = Path(src)
    path = src / ENCODER if src.is_dir() else src
    if not path.is_file():
        raise SourceError(f"{path}: not found; give a source folder with {ENCODER} or an encoder .onnx")
    return ir.load(path)


def needs_fusion(model: ir.Model) -> bool:
    """Something decomposed to fuse: an anchor op, or a residual Add feeding a LayerNormalization."""
    return any(n.op_type in ANCHORS for n in model.graph) or any(
        n.op_type == "LayerNormalization" and n.domain == "" and prod(n.inputs[0], "Add") is not None
        for n in model.graph)


def fuse_encoder(src: Path | ir.Model) -> tuple[ir.Model, dict]:
    """Fuse an encoder; returns (model, report dict with census before/after and what was not fused)."""
    model = src if isinstance(src, ir.Model) else load_encoder(src)
    return model, fuse_graph(model, STEPS, {"decomposed": needs_fusion(model)})

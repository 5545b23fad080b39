"""The WebGPU form of a built decoder, rewritten file to file; the weights file is shared.

onnxruntime-web's WebGPU EP runs Qwen3's Q/K RMS norms inside GroupQueryAttention (q_norm_weight /
k_norm_weight: 6 nodes fewer per layer, as the onnxruntime-genai builder emits for WebGPU; logits
equal to the explicit form's on SwiftShader, tests/test_decoder_webgpu.py). onnxruntime CPU and
onnxruntime-web's wasm EP refuse those inputs, so the wasm fallback twin and the Python reference
run the explicit form (fusion.qk_norm_in_gqa has both directions).

The WebGPU form also carries its own MatMulNBits accuracy level (`quantize.webgpu_accuracy_level`):
on a GPU with subgroups onnxruntime-web 1.30 runs level 4 as two dispatches per MatMulNBits (int8
activation quantization, then DP4A) and then skips its decode-time fusions (norm + Q/K/V, gate + up
+ SiLU), while level 0 decodes in one fused dispatch per group with fp32 accumulation (BENCHMARKS.md,
issue 14).
"""

from __future__ import annotations

from pathlib import Path

import onnx_ir as ir

from webbuild.forms.form import Form, Made, Miss
from webbuild.fusion import qk_norm_in_gqa
from webbuild.fusion.rule_report import Report as FusionReport
from webbuild.graph.files import rewrite_file


def webgpu_form(src: Path, dest: Path, accuracy_level: int | None = None) -> Made | Miss | None:
    """Write the WebGPU form of `src` to `dest` (WEBGPU). None where `src` is that form already (no Q/K norm
    to move, every MatMulNBits at the level): nothing written. A Q/K norm pair left explicit (qk_norm_in_gqa's
    misses) loses part of the form: the WebGPU decoder runs it as separate nodes."""
    fusion = FusionReport()
    written = rewrite_file(src, dest, lambda m: _webgpu_form(m, accuracy_level, fusion))
    left = tuple(Miss(f"Q/K norms at {m['at']} stay outside GroupQueryAttention: {m['why']}")
                 for m in fusion.missed)
    if not written:
        return left[0] if left else None
    return Made(dest.name, left)


def norms_into_gqa(src: Path, dest: Path, accuracy_level: int | None = None) -> bool:
    """webgpu_form without the driver: True when it wrote `dest`."""
    return isinstance(webgpu_form(src, dest, accuracy_level), Made)


def _webgpu_form(model: ir.Model, accuracy_level: int | None, fusion: FusionReport) -> bool:
    """Both rewrites, the norms' misses into `fusion`; True when either changed the graph."""
    moved = qk_norm_in_gqa.apply(model, fusion) > 0
    leveled = accuracy_level is not None and set_accuracy_level(model, accuracy_level) > 0
    return moved or leveled


def set_accuracy_level(model: ir.Model, level: int) -> int:
    """Every MatMulNBits at `level`; returns how many changed."""
    changed = 0
    for node in model.graph.all_nodes():
        attr = node.attributes.get("accuracy_level")
        if node.op_type == "MatMulNBits" and (attr is None or attr.as_int() != level):
            node.attributes["accuracy_level"] = ir.AttrInt64("accuracy_level", level)
            changed += 1
    return changed


def norms_out_of_gqa(src: Path, dest: Path) -> bool:
    """The form onnxruntime CPU and the wasm EP run: explicit SimplifiedLayerNormalization nodes."""
    return rewrite_file(src, dest, qk_norm_in_gqa.take_out)


WEBGPU = Form("webgpu", "a fused decoder: Q/K norms inside GroupQueryAttention, MatMulNBits at "
              "quantize.webgpu_accuracy_level", webgpu_form)

"""Per-runtime forms of a built decoder graph, rewritten file to file; the weights file is shared.

onnxruntime-web's WebGPU EP runs Qwen3's Q/K RMS norms inside GroupQueryAttention (q_norm_weight /
k_norm_weight: 6 nodes fewer per layer, as the onnxruntime-genai builder emits for WebGPU; logits
equal to the explicit form's on SwiftShader, tests/test_decoder_webgpu.py). onnxruntime CPU and
onnxruntime-web's wasm EP refuse those inputs, so the wasm fallback twin and the Python reference
run the explicit form (fusion.qk_norm_in_gqa has both directions).

The WebGPU form also carries its own MatMulNBits accuracy level (`quantize.webgpu_accuracy_level`):
on a GPU with subgroups onnxruntime-web 1.30 runs level 4 as two dispatches per MatMulNBits (int8
activation quantization, then DP4A) and then skips its decode-time fusions (norm + Q/K/V, gate + up
+ SiLU), while level 0 decodes in one fused dispatch per group with fp32 accumulation (BENCHMARKS.md,
issue 14). The wasm twin keeps `quantize.accuracy_level`: on the CPU int8 kernels are the fast ones.

The step form (webbuild.pipeline.step_form) is the WebGPU form for one decode token that graph capture
can record; the runtime decodes with it after the plain prefill (runtime/capture.js).

A build with LoRA adapters also gets the adapted decoder (webbuild.pipeline.lora_form), made from the
quantized graph before any of these forms, then given the same forms as the base decoder.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx_ir as ir

from webbuild.fusion import qk_norm_in_gqa
from webbuild.fusion.rule_report import Report
from webbuild.graph.files import rewrite_file
from webbuild.pipeline.lora_form import lora_form
from webbuild.pipeline.step_form import step_form
from webbuild.quantize.wasm_twin import twin_name, wasm_graph


def norms_into_gqa(src: Path, dest: Path, accuracy_level: int | None = None) -> bool:
    """The WebGPU form: Q/K norms moved into GroupQueryAttention, and every MatMulNBits at
    `accuracy_level` (None: as quantized)."""
    return rewrite_file(src, dest, lambda m: _webgpu_form(m, accuracy_level))


def _webgpu_form(model: ir.Model, accuracy_level: int | None) -> bool:
    """Both rewrites; True when either changed the graph."""
    moved = qk_norm_in_gqa.apply(model, Report()) > 0
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


def webgpu_decoder(folder: Path, name: str, wasm_twin: bool, accuracy_level: int | None = None,
                   fold_matmuls: bool = True) -> str | None:
    """Rewrite `folder/name` in place into the WebGPU form (MatMulNBits at `accuracy_level`, None: as
    quantized). With `wasm_twin`, first keep the form the wasm EP runs as `<name>.wasm.onnx` (explicit
    norms, the int4 lookup and, with `fold_matmuls`, the int4 weights in standard ops: see
    webbuild.quantize.wasm_twin) and return its name; None when no twin is needed."""
    path, webgpu = folder / name, folder / f"{name}.webgpu"
    twin = folder / twin_name(name)
    moved = norms_into_gqa(path, webgpu, accuracy_level)
    rewritten = wasm_twin and wasm_graph(path, twin, fold_matmuls)
    if wasm_twin and moved and not rewritten:
        shutil.copyfile(path, twin)  # the explicit graph as it is
    if moved:
        webgpu.replace(path)
    return twin.name if wasm_twin and (moved or rewritten) else None


def step_decoder(folder: Path, name: str) -> str | None:
    """Write the step form of the WebGPU decoder `folder/name` beside it as `<stem>.step.onnx` (same
    weights file); its name, or None for a decoder it does not apply to (no token-id input, no GQA)."""
    dest = folder / f"{Path(name).stem}.step.onnx"
    return dest.name if rewrite_file(folder / name, dest, step_form) else None


def lora_decoder(folder: Path, name: str) -> str:
    """Write the adapted form of the decoder `folder/name` beside it as `<stem>.lora.onnx` (same weights
    file); its name. Raises lora_form.NoProjections for a decoder whose projections cannot be found."""
    dest = folder / f"{Path(name).stem}.lora.onnx"
    rewrite_file(folder / name, dest, lora_form)
    return dest.name

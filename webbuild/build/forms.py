"""Per-runtime forms of a built decoder graph, rewritten file to file; the weights file is shared.

onnxruntime-web's WebGPU EP runs Qwen3's Q/K RMS norms inside GroupQueryAttention (q_norm_weight /
k_norm_weight: 6 nodes fewer per layer, as the onnxruntime-genai builder emits for WebGPU; logits
equal to the explicit form's on SwiftShader, tests/test_decoder_webgpu.py). onnxruntime CPU and
onnxruntime-web's wasm EP refuse those inputs, so the wasm fallback twin and the Python reference
run the explicit form (fusion.qk_norm_in_gqa has both directions).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from webbuild.fusion import qk_norm_in_gqa
from webbuild.fusion.report import Report
from webbuild.graph.files import rewrite_file
from webbuild.quantize.wasm_twin import twin_name, wasm_graph


def norms_into_gqa(src: Path, dest: Path) -> bool:
    """The WebGPU form: Q/K norms moved into GroupQueryAttention."""
    return rewrite_file(src, dest, lambda m: qk_norm_in_gqa.apply(m, Report()))


def norms_out_of_gqa(src: Path, dest: Path) -> bool:
    """The form onnxruntime CPU and the wasm EP run: explicit SimplifiedLayerNormalization nodes."""
    return rewrite_file(src, dest, qk_norm_in_gqa.take_out)


def webgpu_decoder(folder: Path, name: str, wasm_twin: bool) -> str | None:
    """Rewrite `folder/name` in place into the WebGPU form. With `wasm_twin`, first keep the form the
    wasm EP runs as `<name>.wasm.onnx` (explicit norms, int4 lookup and weights in standard ops: see
    webbuild.quantize.wasm_twin) and return its name; None when no twin is needed."""
    path, webgpu = folder / name, folder / f"{name}.webgpu"
    twin = folder / twin_name(name)
    moved = norms_into_gqa(path, webgpu)
    rewritten = wasm_twin and wasm_graph(path, twin)
    if wasm_twin and moved and not rewritten:
        shutil.copyfile(path, twin)  # the explicit graph as it is
    if moved:
        webgpu.replace(path)
    return twin.name if wasm_twin and (moved or rewritten) else None

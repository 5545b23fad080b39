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
issue 14). The wasm twin is in the form its variant's wasm plan chose (webbuild.quantize.wasm_twin:
`int8`, `float` or `matmul_nbits`); an `int8` twin ships with the plan of the uint8 weights the page
derives at load (role `<graph>_wasm_int8`).

The step form (webbuild.pipeline.step_form) is the WebGPU form for one decode token that graph capture
can record; the runtime decodes with it after the plain prefill (runtime/capture.js).

A build with LoRA adapters also gets the adapted decoder (webbuild.pipeline.lora_form), made from the
quantized graph before any of these forms, then given the same forms as the base decoder, and the delta graph
that makes its step form's merged updates at a switch (webbuild.pipeline.lora_delta).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx_ir as ir

from webbuild.errors import BuildError
from webbuild.fusion import qk_norm_in_gqa
from webbuild.fusion.rule_report import Report
from webbuild.graph.files import rewrite_file
from webbuild.pipeline.lora_delta import write_delta_graph
from webbuild.pipeline.lora_form import NoProjections, lora_form, spare_readers, step_layout
from webbuild.pipeline.state import Variant
from webbuild.pipeline.step_form import step_form
from webbuild.quantize.wasm_twin import int8_plan_name, twin_name, wasm_graph


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


def variant_forms(v: Variant, dest: Path, wasm_forms: dict[str, str] | None, accuracy_level: int | None,
                  adapted: bool) -> Variant:
    """Every file of variant `v` as it ships, written once into `dest`: weights files and the encoder copied,
    the encoder's wasm twin where the wasm plan folds its MatMulNBits (`wasm_forms`: the plan's form of
    each graph; None for a variant the wasm EP never runs), the decoder's forms (`decoder_forms`) and, for
    a build with adapters (`adapted`), the adapted decoder's (made from the quantized decoder first, as
    `decoder_lora`, with `decoder_lora_delta` where its step form merges updates). Roles keep the order the
    manifest lists them in."""
    shipped = Variant(v.name, dest, dict(v.files))
    for role, name in v.files.items():
        if role not in ("decoder", "decoder_lora"):
            shutil.copyfile(v.path(role), dest / name)  # a copy: onnx refuses weights files with hard links
    wasm_twin, forms = wasm_forms is not None, wasm_forms or {}
    decoder = v.files.get("decoder")
    roles = []
    if decoder and adapted:
        roles.append(("decoder_lora", v.dir / _adapted_decoder(v, decoder)))
    if decoder:
        roles.append(("decoder", v.path("decoder")))
    for role, src in roles:
        layout: dict[str, dict] = {}
        made = decoder_forms(src, dest, src.name, wasm_twin, accuracy_level, forms.get("decoder", "matmul_nbits"),
                             layout)
        shipped.files |= {role: made["graph"]} | {f"{role}_{kind}": made[kind] for kind in ("wasm", "wasm_int8", "step")
                                                  if kind in made}
        if role == "decoder_lora" and "step" in made:
            shipped.lora_layout = layout
            delta = f"{Path(made['step']).stem.removesuffix('.step')}.delta.onnx"
            if write_delta_graph(dest / made["step"], dest / delta):
                shipped.files["decoder_lora_delta"] = delta
    encoder = v.files.get("encoder")
    # the int4 encoder's MatMulNBits are slow on wasm: in the plan's faster form where it has one
    form = forms.get("encoder", "matmul_nbits")
    if encoder and form != "matmul_nbits" and wasm_graph(v.path("encoder"), dest / twin_name(encoder), form):
        shipped.files["encoder_wasm"] = twin_name(encoder)
        if (dest / int8_plan_name(twin_name(encoder))).exists():
            shipped.files["encoder_wasm_int8"] = int8_plan_name(twin_name(encoder))
    return shipped


def _adapted_decoder(v: Variant, decoder: str) -> str:
    """The adapted form of the quantized decoder, beside it (a scratch file: its forms are what ships)."""
    try:
        return lora_decoder(v.dir, decoder)
    except NoProjections as exc:
        raise BuildError(f"adapters: the {v.name} decoder cannot take LoRA adapters: {exc}") from exc


def decoder_forms(src: Path, dest: Path, name: str, wasm_twin: bool, accuracy_level: int | None,
                  wasm_form: str, layout: dict[str, dict] | None = None) -> dict[str, str]:
    """The shipped forms of the decoder graph `src`, each written once into `dest` (which holds its weights
    file): the WebGPU form as `name`, its wasm twin (in `wasm_form`, wasm_twin.FORMS) and its step form
    beside it, whose lora inputs' layout (lora_form.step_layout) goes into `layout`. Returns the written
    files by kind: `graph`, and `wasm`, `wasm_int8` (the int8 twin's plan) and `step` where they apply."""
    twin = _decoder_twin_and_webgpu(src, dest / name, dest / twin_name(name), wasm_twin, accuracy_level,
                                    wasm_form)
    if not (dest / name).exists():  # already the WebGPU form: shipped as it is
        shutil.copyfile(src, dest / name)
    forms = {"graph": name} | ({"wasm": twin} if twin else {})
    if twin and (dest / int8_plan_name(twin)).exists():
        forms["wasm_int8"] = int8_plan_name(twin)
    if step := step_decoder(dest, name, layout):
        forms["step"] = step
    return forms


def _decoder_twin_and_webgpu(src: Path, webgpu: Path, twin: Path, wasm_twin: bool, accuracy_level: int | None,
                             wasm_form: str) -> str | None:
    """Write the WebGPU form of `src` to `webgpu` (where it differs from `src`) and, with `wasm_twin`, the
    form the wasm EP runs to `twin`; the twin's name, or None when no twin is needed."""
    moved = norms_into_gqa(src, webgpu, accuracy_level)
    rewritten = wasm_twin and wasm_graph(src, twin, wasm_form)
    if wasm_twin and moved and not rewritten:
        shutil.copyfile(src, twin)  # the explicit graph as it is
    return twin.name if wasm_twin and (moved or rewritten) else None


def step_decoder(folder: Path, name: str, layout: dict[str, dict] | None = None) -> str | None:
    """Write the step form of the WebGPU decoder `folder/name` beside it as `<stem>.step.onnx` (same
    weights file); its name, or None for a decoder it does not apply to (no token-id input, no GQA). Its
    lora inputs' layout (an adapted decoder's: lora_form.step_layout) goes into `layout`."""
    dest = folder / f"{Path(name).stem}.step.onnx"

    def finish(model: ir.Model) -> int:
        if layout is not None:
            layout.update(step_layout(model))
        return spare_readers(model)

    return dest.name if rewrite_file(folder / name, dest, step_form, finish=finish) else None


def lora_decoder(folder: Path, name: str) -> str:
    """Write the adapted form of the decoder `folder/name` beside it as `<stem>.lora.onnx` (same weights
    file); its name. Raises lora_form.NoProjections for a decoder whose projections cannot be found."""
    dest = folder / f"{Path(name).stem}.lora.onnx"
    rewrite_file(folder / name, dest, lora_form)
    return dest.name

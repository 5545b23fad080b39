"""The forms stage's work on one variant: every file it ships, written once. The graph forms themselves and
their driver are webbuild.forms'; this module knows the variant's roles and files."""

from __future__ import annotations

import shutil
from pathlib import Path

from webbuild.errors import BuildError
from webbuild.forms.decoder import decoder_forms
from webbuild.forms.form import Report
from webbuild.forms.lora import ADAPTED
from webbuild.forms.lora_delta import DELTA
from webbuild.forms.shared_weights import weights_table
from webbuild.forms.step import ATTENTIONS
from webbuild.forms.wasm_twin import WASM_TWIN, int8_plan_name, twin_name
from webbuild.pipeline.state import Variant

# the decoder's forms beside its WebGPU graph, each shipped under the role `<role>_<kind>` (contract.FILE_ROLES)
KINDS = ("wasm", "wasm_int8", "step", "shared", "step_shared")


def variant_forms(v: Variant, dest: Path, wasm_forms: dict[str, str] | None, accuracy_level: int | None,
                  adapted: bool, report: Report | None = None, step_attention: str = ATTENTIONS[0]) -> Variant:
    """Every file of variant `v` as it ships, written once into `dest`: weights files and the encoder copied,
    the encoder's wasm twin where the wasm plan folds its MatMulNBits (`wasm_forms`: the plan's form of
    each graph; None for a variant the wasm EP never runs), the decoder's forms (`decoder_forms`) and, for
    a build with adapters (`adapted`), the adapted decoder's (made from the quantized decoder first, as
    `decoder_lora`, with `decoder_lora_delta` where its step form merges updates). Roles keep the order the
    manifest lists them in. Every form made or missed goes into `report`, under `<variant>/<role>`; the step forms'
    attention is `step_attention` (webbuild.forms.step)."""
    report = report if report is not None else Report()
    shipped = Variant(v.name, dest, dict(v.files))
    for role, name in v.files.items():
        if role not in ("decoder", "decoder_lora"):
            shutil.copyfile(v.path(role), dest / name)  # a copy: onnx refuses weights files with hard links
    wasm_twin, forms = wasm_forms is not None, wasm_forms or {}
    decoder = v.files.get("decoder")
    roles = []
    if decoder and adapted:
        roles.append(("decoder_lora", v.dir / _adapted_decoder(v, decoder, report)))
    if decoder:
        roles.append(("decoder", v.path("decoder")))
    for role, src in roles:
        layout: dict[str, dict] = {}
        # the shared-weights forms for the base decoder only: the adapted one keeps its own weights
        shared = v.files.get("decoder_data") if role == "decoder" else None
        made = decoder_forms(src, dest, src.name, wasm_twin, accuracy_level, forms.get("decoder", "matmul_nbits"),
                             layout, report, f"{v.name}/{role}", step_attention, shared)
        shipped.files |= {role: made["graph"]} | {f"{role}_{kind}": made[kind] for kind in KINDS if kind in made}
        if shared and "shared" in made:
            shipped.weights = weights_table(dest / made["graph"], shared)
        if role == "decoder_lora" and "step" in made:
            shipped.lora_layout = layout
            delta = f"{Path(made['step']).stem.removesuffix('.step')}.delta.onnx"
            if report.make(DELTA, f"{v.name}/decoder_lora_step", dest / made["step"], dest / delta):
                shipped.files["decoder_lora_delta"] = delta
    encoder = v.files.get("encoder")
    # the int4 encoder's MatMulNBits are slow on wasm: in the plan's faster form where it has one
    form = forms.get("encoder", "matmul_nbits")
    if encoder and form != "matmul_nbits" and report.make(WASM_TWIN, f"{v.name}/encoder", v.path("encoder"),
                                                          dest / twin_name(encoder), form):
        shipped.files["encoder_wasm"] = twin_name(encoder)
        if (dest / int8_plan_name(twin_name(encoder))).exists():
            shipped.files["encoder_wasm_int8"] = int8_plan_name(twin_name(encoder))
    return shipped


def _adapted_decoder(v: Variant, decoder: str, report: Report) -> str:
    """The adapted form of the quantized decoder, beside it (a scratch file: its forms are what ships). The
    adapters were asked for, so a decoder that cannot take them stops the build, --strict or not."""
    if made := report.make(ADAPTED, f"{v.name}/decoder", v.dir, decoder):
        return made
    raise BuildError(f"adapters: the {v.name} decoder cannot take LoRA adapters: {report.missed[-1]['why']}")

"""The shipped forms of one decoder graph, each written once, file to file, through the forms driver
(webbuild.forms.form): the WebGPU form (webbuild.forms.webgpu), its wasm twin in the form its variant's wasm plan
chose (webbuild.forms.wasm_twin: `int8`, `float` or `matmul_nbits`; an `int8` twin ships with the plan of the uint8
weights the page derives at load, role `<graph>_wasm_int8`) and its step form (webbuild.forms.step), which graph
capture records and the runtime decodes with after the plain prefill (runtime/capture.js); given the weights file,
the shared-weights form of both (webbuild.forms.shared_weights: one upload of the weights feeds both sessions).

A build with LoRA adapters also gets the adapted decoder (webbuild.forms.lora), made from the quantized graph
before any of these forms, then given the same forms as the base decoder, and the delta graph that makes its step
form's merged updates at a switch (webbuild.forms.lora_delta); webbuild.pipeline.forms runs them per variant.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from webbuild.forms.form import Report
from webbuild.forms.shared_weights import SHARED
from webbuild.forms.step import ATTENTIONS, STEP
from webbuild.forms.wasm_twin import WASM_TWIN, int8_plan_name, twin_name
from webbuild.forms.webgpu import WEBGPU


def decoder_forms(src: Path, dest: Path, name: str, wasm_twin: bool, accuracy_level: int | None,
                  wasm_form: str, layout: dict[str, dict] | None = None, report: Report | None = None,
                  graph: str | None = None, step_attention: str = ATTENTIONS[0],
                  shared_data: str | None = None) -> dict[str, str]:
    """The shipped forms of the decoder graph `src`, each written once into `dest` (which holds its weights
    file): the WebGPU form as `name`, its wasm twin (in `wasm_form`, wasm_twin.FORMS) and its step form
    beside it, whose lora inputs' layout (lora.step_layout) goes into `layout`. Each form made or missed goes
    into `report` under `graph` (default `name`); the step form's attention is `step_attention` (webbuild.forms.step).
    With `shared_data` (the weights file's name), the shared-weights forms of the WebGPU form and the step form.
    Returns the written files by kind: `graph`, and `wasm`, `wasm_int8` (the int8 twin's plan), `step`, `shared`
    and `step_shared` where they apply."""
    report = report if report is not None else Report()
    label = graph or name
    moved = report.make(WEBGPU, label, src, dest / name, accuracy_level) is not None
    if not moved:  # already the WebGPU form: shipped as it is
        shutil.copyfile(src, dest / name)
    twin = _twin(src, dest / twin_name(name), wasm_form, moved, report, label) if wasm_twin else None
    forms = {"graph": name} | ({"wasm": twin} if twin else {})
    if twin and (dest / int8_plan_name(twin)).exists():
        forms["wasm_int8"] = int8_plan_name(twin)
    if step := report.make(STEP, label, dest, name, layout, step_attention):
        forms["step"] = step
    if shared_data:
        for kind in ("graph", "step"):
            if kind in forms and (made := report.make(SHARED, f"{label}/{kind}", dest, forms[kind], shared_data)):
                forms["shared" if kind == "graph" else "step_shared"] = made
    return forms


def _twin(src: Path, twin: Path, wasm_form: str, moved: bool, report: Report, label: str) -> str | None:
    """The form the wasm EP runs of `src`, written to `twin`; its name, or None when the WebGPU form (not `moved`
    from `src`) runs there as it is."""
    if report.make(WASM_TWIN, label, src, twin, wasm_form):
        return twin.name
    if moved:
        shutil.copyfile(src, twin)  # the explicit graph as it is
        return twin.name
    return None

"""The shared-weights form of a WebGPU decoder graph: the same graph with every initializer its weights file holds
turned into a graph input of the same name, and the weights' table (where each lies in that file).

Each session onnxruntime-web makes uploads its own copy of its initializers (its WebGPU provider records the
uploads when the session is made and submits them with its first run), so the decoder's prefill session and its
step session upload the same weights twice. Given this form, the page uploads each weight once, straight from the
downloaded file (runtime/weights.js), and feeds the same GPU tensors to both sessions: onnxruntime's WebGPU fusions
take the weights as inputs alike (BENCHMARKS.md, "One copy of the decoder's weights for its sessions"). The page
runs it where asked (`?weights=shared`) until it is measured on GPUs.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from webbuild.forms.form import Form, Made, Miss

SUFFIX = ".shared.onnx"


def shared_name(graph: str) -> str:
    """The shared-weights form's file name of graph file `graph`."""
    return f"{graph.removesuffix('.onnx')}{SUFFIX}"


def shared_weights_form(dest: Path, graph: str, data: str) -> Made | Miss:
    """Write the shared-weights form of `dest/graph`, whose weights live in `dest/data`, beside it."""
    model = onnx.load(dest / graph, load_external_data=False)
    inputs = {i.name for i in model.graph.input}
    kept, moved = [], []
    for init in model.graph.initializer:
        if init.data_location != TensorProto.EXTERNAL or _location(init) != data or init.name in inputs:
            kept.append(init)
            continue
        moved.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    if not moved:
        return Miss(f"no initializer of {graph} lives in {data}", loses=False)
    model.graph.input.extend(moved)
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    onnx.save(model, dest / shared_name(graph))
    return Made(shared_name(graph))


def weights_table(path: Path, data: str) -> dict[str, dict]:
    """The weights graph file `path` reads from its weights file `data`, by name: the ONNX element type's name,
    dims, and where the bytes lie in the file (offset, length), as runtime/weights.js uploads them."""
    model = onnx.load(path, load_external_data=False)
    table = {}
    for init in model.graph.initializer:
        if init.data_location != TensorProto.EXTERNAL or _location(init) != data:
            continue
        entry = {e.key: e.value for e in init.external_data}
        table[init.name] = {"type": helper.tensor_dtype_to_np_dtype(init.data_type).name, "dims": list(init.dims),
                            "offset": int(entry.get("offset", 0)), "length": int(entry["length"])}
    return table


def differences(original: Path, shared: Path, table: dict[str, dict], data: str) -> list[str]:
    """What keeps graph file `shared` with the weights of `table` fed as inputs from being `original` (the check
    stage's row of a shared-weights form): the same nodes, the same inputs plus one per weight of the table, each of
    the original's type and shape, and the table's every entry where the original's initializer lies; empty: none."""
    a = onnx.load(original, load_external_data=False).graph
    b = onnx.load(shared, load_external_data=False).graph
    problems = []
    if [n.SerializeToString() for n in a.node] != [n.SerializeToString() for n in b.node]:
        problems.append("its nodes differ from the graph's")
    expected = weights_table(original, data)
    names = set(expected)
    if table != expected:
        problems.append("the manifest's weights are not where the graph's initializers lie in " + data)
    inputs = {i.name: i.type.SerializeToString() for i in b.input}
    for init in a.initializer:
        if init.name in names and inputs.get(init.name) != helper.make_tensor_type_proto(
                init.data_type, list(init.dims)).SerializeToString():
            problems.append(f"input {init.name} is not of its initializer's type and shape")
    if set(inputs) != {i.name for i in a.input} | names:
        problems.append("its inputs are not the graph's and the weights'")
    kept = {i.name for i in b.initializer}
    if kept != {i.name for i in a.initializer} - names:
        problems.append("its initializers are not the graph's but the weights")
    return problems


def _location(init: onnx.TensorProto) -> str:
    return next((e.value for e in init.external_data if e.key == "location"), "")


SHARED = Form("shared_weights", "a WebGPU decoder graph and its step form, whose weights live in the variant's "
              "weights file", shared_weights_form)

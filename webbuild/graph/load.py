"""Reading a user's ONNX file with errors a user can act on: the one place model files given as input
are opened, so a corrupt graph or a truncated weights file is a one-line SourceError naming the file
(exit code 2) instead of a protobuf or numpy traceback from deep inside a stage.

The weights check costs a stat per external data file: it compares the byte ranges the graph reads
with the files' sizes, without reading the weights.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from webbuild.errors import SourceError

FIX = "re-export or re-download the model"
UNSORTED = "Nodes in a graph must be topologically sorted"  # onnx's checker


def load_onnx(path: str | os.PathLike, external_data: bool = False, own_files: bool = False) -> onnx.ModelProto:
    """The graph at `path` (weights too with `external_data`), checked: a SourceError when the file is
    missing, is not an ONNX model, or its external weights file is missing or shorter than it says.
    Also called only to check a file that another library then opens itself (onnxruntime, onnx_ir),
    whose own errors are tracebacks; `own_files` for onnx_ir, which also wants the weights files in the
    graph's folder and without other hard links, and a graph that onnx's checker accepts (its writer
    fails on what the checker refuses)."""
    path = Path(path)
    if not path.is_file():
        raise SourceError(f"{path}: no such file; {FIX}")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except DecodeError as exc:
        raise SourceError(f"{path}: not an ONNX model ({_reason(exc)}); {FIX}") from None
    # protobuf parses an empty file, and some garbage, as an empty message: no graph, no IR version
    if not model.ir_version or not model.HasField("graph"):
        raise SourceError(f"{path}: not an ONNX model (no graph in its {path.stat().st_size} bytes); {FIX}")
    check_external_data(path, model, own_files)
    if bad := next((name for name in _names(model.graph) if not isinstance(name, str)), None):
        raise SourceError(f"{path}: the name {bad!r} in its graph is not UTF-8 text; {FIX}")
    if own_files:
        _check_graph(path, model)
    if external_data:
        onnx.load_external_data_for_model(model, str(path.parent))
    return model


def _check_graph(path: Path, model: onnx.ModelProto) -> None:
    """onnx's checker on the graph at `path`; nodes out of topological order, which onnxruntime loads (and
    fusion sorts, webbuild.graph.ir.sort_nodes), are checked in order instead, a cycle refused."""
    try:
        onnx.checker.check_model(str(path))  # by path: the weights files are found beside it
    except onnx.checker.ValidationError as exc:
        reason = str(exc).strip().splitlines()[0]
        if UNSORTED in reason:
            return _check_sorted(path, model)
        # the checker knows onnxruntime's ops in the default domain (fused sources use them) by no schema:
        # where it meets one it stops, without a verdict on the graph
        if "No Op registered" not in reason:
            raise SourceError(f"{path}: not a valid ONNX graph ({reason}); {FIX}") from None


def _check_sorted(path: Path, model: onnx.ModelProto) -> None:
    import onnx_ir as ir

    graph = ir.serde.deserialize_model(model)  # the weights stay in their files: the checker reads no bytes
    try:
        graph.graph.sort()  # subgraphs too, as fusion sorts it (webbuild.graph.ir.sort_nodes)
    except ValueError as exc:
        raise SourceError(f"{path}: not a valid ONNX graph (its nodes form a cycle: {exc}); {FIX}") from None
    checked = ir.serde.serialize_model(graph)
    # weights become typed graph inputs: the checker then needs neither their bytes nor their files, which it
    # looks for beside the working folder when given no path
    inits = checked.graph.initializer
    checked.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in inits)
    checked.graph.ClearField("initializer")
    try:
        onnx.checker.check_model(checked)
    except onnx.checker.ValidationError as exc:
        reason = str(exc).strip().splitlines()[0]
        if "No Op registered" not in reason:
            raise SourceError(f"{path}: not a valid ONNX graph ({reason}); {FIX}") from None


def check_external_data(path: Path, model: onnx.ModelProto, own_files: bool = False) -> None:
    """Every external tensor of `model` (loaded from `path`) must lie inside its weights file."""
    needed: dict[str, int] = {}  # weights file -> bytes the graph reads from it
    for t in _tensors(model.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            info = {e.key: e.value for e in t.external_data}
            end = int(info.get("offset", 0)) + int(info.get("length", 0))
            needed[info["location"]] = max(needed.get(info["location"], 0), end)
    for location, end in needed.items():
        weights = path.parent / location
        if not weights.is_file():
            raise SourceError(f"{path}: its weights file {weights.name} is missing; {FIX}")
        if own_files:
            _check_contained(path, weights)
        size = weights.stat().st_size
        if size < end:
            raise SourceError(f"{weights}: truncated ({size} bytes; {path.name} reads {end}); {FIX}")


def _check_contained(path: Path, weights: Path) -> None:
    """onnx-ir (what fusion reads graphs with) refuses weights outside the graph's folder, through a symbolic
    link or not, and weights files with several hard links (its guards against link attacks)."""
    folder = path.parent.resolve()
    if not weights.resolve().is_relative_to(folder) or not weights.absolute().is_relative_to(path.parent.absolute()):
        raise SourceError(f"{weights}: lies outside {path.name}'s folder (through a symbolic link or '..'), which "
                          "the ONNX reader refuses; copy the file itself into the folder (cp -L)")
    if (links := weights.stat().st_nlink) > 1:
        raise SourceError(f"{weights}: has {links} hard links, which the ONNX reader refuses; make it a file of "
                          "its own (cp it to a new name, then move that over it)")


def _names(graph: onnx.GraphProto) -> Iterator[str | bytes]:
    """Every name of `graph`: protobuf hands a string field that is not UTF-8 over as bytes, which every
    later reader fails on in its own way."""
    for node in graph.node:
        yield from (node.name, node.op_type, node.domain, *node.input, *node.output)
    for value in (*graph.input, *graph.output, *graph.value_info, *graph.initializer):
        yield value.name


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Initializers and constant tensors of `graph` and its subgraphs (If / Loop bodies)."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            for sub in (*([attr.g] if attr.HasField("g") else []), *attr.graphs):
                yield from _tensors(sub)


def _reason(exc: Exception) -> str:
    """protobuf's message without the type name it starts with."""
    return str(exc).rsplit(": ", 1)[-1] or type(exc).__name__

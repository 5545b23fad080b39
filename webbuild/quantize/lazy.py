"""Leave a decoder's float MatMul weights on disk until the quantizer reads them.

`onnx.load` of a fused 1.7B decoder holds its 6.9 GB of fp32 weights in memory before quantization
turns them into under 1 GB of int4. Loaded lazily, every MatMul weight instead points at its data
file by absolute path; onnxruntime's quantizer reads initializers through onnx_ir, which memory-maps
external data, so only the weight being quantized is read. onnx's own readers refuse absolute
locations, so `load_deferred` brings back whatever the quantizer left (excluded nodes, method none)
before anything else touches the graph.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from onnx.external_data_helper import load_external_data_for_tensor

from webbuild.graph.load import load_onnx

_FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}


def load_lazily(path: Path) -> onnx.ModelProto:
    """`path` with every external float weight used only as a MatMul's B deferred (see module doc);
    other external data is loaded as `onnx.load` would."""
    path = Path(path)
    model = load_onnx(path)
    base = path.parent.resolve()
    deferrable = _matmul_weights(model.graph)
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        if t.name in deferrable and t.data_type in _FLOATS:
            _set_location(t, str(base / _location(t)))
        else:
            load_external_data_for_tensor(t, str(base))
            t.data_location = onnx.TensorProto.DEFAULT
            del t.external_data[:]
    return model


def load_deferred(model: onnx.ModelProto) -> int:
    """Read the deferred weights still in `model` into memory; returns how many."""
    count = 0
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL and os.path.isabs(_location(t)):
            info = {e.key: e.value for e in t.external_data}
            with open(info["location"], "rb") as f:
                f.seek(int(info.get("offset", 0)))
                t.raw_data = f.read(int(info["length"])) if "length" in info else f.read()
            t.data_location = onnx.TensorProto.DEFAULT
            del t.external_data[:]
            count += 1
    return count


def _matmul_weights(graph: onnx.GraphProto) -> set[str]:
    """Initializers whose every use is a MatMul's second input (what the quantizer replaces)."""
    b_of_matmul: set[str] = set()
    other: set[str] = set()
    for node in graph.node:
        for i, name in enumerate(node.input):
            (b_of_matmul if node.op_type == "MatMul" and i == 1 else other).add(name)
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            other |= {n for a in node.attribute for g in [a.g, *a.graphs] for x in g.node for n in x.input}
    return b_of_matmul - other


def _location(t: onnx.TensorProto) -> str:
    return next(e.value for e in t.external_data if e.key == "location")


def _set_location(t: onnx.TensorProto, location: str) -> None:
    for e in t.external_data:
        if e.key == "location":
            e.value = location

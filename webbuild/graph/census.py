"""The op census of a graph: op type -> node count, the one count every report and check uses."""

from __future__ import annotations

import os
from collections import Counter

import onnx
import onnx_ir as ir

from webbuild.graph.load import load_onnx


def op_census(model: str | os.PathLike | onnx.ModelProto | ir.Model) -> dict[str, int]:
    """op type -> nodes of the main graph, most frequent first (ties by name); contrib ops by their plain
    name, as onnxruntime's tools print them. A path is read without its weights."""
    if isinstance(model, (str, os.PathLike)):
        model = load_onnx(model)
    nodes = model.graph.node if isinstance(model, onnx.ModelProto) else model.graph
    counts = Counter(n.op_type for n in nodes)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

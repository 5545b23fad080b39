"""Graph rewrites from file to file that never load the weights: the output refers to the input's
external data file, so a rewrite of a multi-GB model costs only its graph."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx
import onnx_ir as ir

from webbuild.graph.ir import dead_code_elimination
from webbuild.graph.load import load_onnx


def rewrite_file(src: Path, dest: Path, rule: Callable[[ir.Model], int],
                 finish: Callable[[ir.Model], int] | None = None) -> bool:
    """Apply `rule` to the graph of `src` and write `dest` beside it; False (nothing written) when the
    rule changes nothing. `finish` runs after the dead-code elimination: nodes no output needs."""
    model = ir.serde.deserialize_model(load_onnx(src))
    if not rule(model):
        return False
    dead_code_elimination(model)
    if finish is not None:
        finish(model)
    write_model(model, dest)
    return True


def write_model(model: ir.Model, dest: Path) -> None:
    """`model` written to `dest`; its external tensors keep pointing into the files they came from."""
    onnx.save(ir.serde.serialize_model(model), str(dest))

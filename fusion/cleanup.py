"""Pre-pass: fold constants, drop Identity / no-op Cast, so the rules see one spelling per op.

torchscript exports carry hundreds of Constant/Shape/Gather/Unsqueeze nodes that fold away;
run only when there is something to fuse, so an already-fused graph is left byte-for-byte alone.
"""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common  # noqa: F401  (registers ir.passes.common)
import onnxscript.optimizer

ANCHORS = {"Softmax", "ReduceMean"}


def needs_fusion(model: ir.Model) -> bool:
    return any(n.op_type in ANCHORS for n in model.graph)


def apply(model: ir.Model) -> None:
    onnxscript.optimizer.optimize_ir(model)
    ir.passes.common.TopologicalSortPass()(model)

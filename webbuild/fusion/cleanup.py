"""Pre-pass: fold constants, drop Identity / no-op Cast, so the rules see one spelling per op.

torchscript exports carry hundreds of Constant/Shape/Gather/Unsqueeze nodes that fold away;
run only when there is something to fuse, so an already-fused graph is left byte-for-byte alone.
"""

from __future__ import annotations

import logging

import onnx_ir as ir
import onnx_ir.passes.common as common
from onnxscript.optimizer import _constant_folding as folding

# what the rules anchor on: decomposed attention and norms, and opset 23's standard ops
ANCHORS = {"Softmax", "ReduceMean", "Attention", "RMSNormalization", "RotaryEmbedding"}
# contrib ops whose output dtype is that of one of their constant inputs (the dequantization scales)
_SCALES_INPUT = {"MatMulNBits": 2, "GatherBlockQuantized": 2}


def needs_fusion(model: ir.Model) -> bool:
    return any(n.op_type in ANCHORS and n.domain in ("", "ai.onnx") for n in model.graph)


def apply(model: ir.Model) -> None:
    _type_contrib_outputs(model)
    # the passes log every contrib op they have no schema for; that is expected here
    logging.getLogger("onnx_ir.passes.common.unused_removal").setLevel(logging.WARNING)
    # onnxscript's optimize_ir minus its pattern rewriter: that part is quadratic in graph size
    # (~6 min on a 28-layer decoder) and finds nothing the fusion rules need
    ir.passes.Sequential(
        ir.passes.PassManager([folding.FoldConstantsPass(
            shape_inference=True, input_size_limit=folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
            output_size_limit=folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT), common.RemoveUnusedNodesPass()],
            steps=2, early_stop=True),
        common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common.DeduplicateInitializersPass(),
        common.CommonSubexpressionEliminationPass(),  # one shape computation per distinct input
        common.TopologicalSortPass(),
    )(model)


def _type_contrib_outputs(model: ir.Model) -> None:
    """Give quantized contrib ops an output dtype so type inference (and with it the removal of
    no-op Casts between them and the norms) reaches past them; onnx has no schema for them."""
    for n in model.graph:
        slot = _SCALES_INPUT.get(n.op_type)
        if slot is None or n.domain != "com.microsoft" or n.outputs[0].type is not None:
            continue
        scales = n.inputs[slot] if len(n.inputs) > slot else None
        if scales is not None and scales.const_value is not None:
            n.outputs[0].type = ir.TensorType(scales.const_value.dtype)

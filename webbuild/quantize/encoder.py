"""Encoder variants: weights/compute at `precision`, output `audio_features` in the decoder variant's type.

precision: fp32 (as exported), fp16 (to_fp16; the fp32 variant keeps fp32, since it serves adapters
without shader-f16), int8 / int4 (MatMulNBits weight-only, block 32, symmetric; compute in the
variant's float type). The input (`pcm` or `mel`) stays fp32 in every file
(Web Audio gives Float32Array) and the mel front-end, if present (node outputs `fe_*`), stays fp32:
|STFT|^2 of a full-scale 400-sample frame exceeds the fp16 range and log10's 1e-10 floor underflows.
The output is cast to the decoder variant's float type, so the page feeds it to the decoder as is.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from webbuild.config import Quantize
from webbuild.quantize.precision import to_fp16
from webbuild.quantize.quantize_matmuls import quantize_matmuls

PRECISIONS = ("fp32", "fp16", "int8", "int4")
FRONTEND_PREFIX = "fe_"
_ELEM = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16}


def encoder_variant(model: onnx.ModelProto, precision: str, variant: str, accuracy_level: int = 4) -> onnx.ModelProto:
    """`model` (fp32 encoder) at `precision`, output typed for decoder variant `variant` (fp16|fp32)."""
    if precision not in PRECISIONS:
        raise ValueError(f"encoder precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    if precision == "fp16" and variant == "fp32":
        precision = "fp32"  # the fp32 variant is for adapters without shader-f16: no fp16 compute
    if precision in ("int8", "int4"):
        model = quantize_matmuls(model, Quantize(bits=int(precision[3:]), accuracy_level=accuracy_level))
    if precision == "fp16" or (precision != "fp32" and variant == "fp16"):
        model = to_fp16(model, keep_io=[i.name for i in model.graph.input], extra_fp32_prefixes=(FRONTEND_PREFIX,))
    _cast_output(model, _ELEM[variant])
    return model


def _cast_output(model: onnx.ModelProto, elem: int) -> None:
    out = model.graph.output[0]
    if out.type.tensor_type.elem_type == elem:
        return
    inner = out.name + "_" + ("fp16" if elem == TensorProto.FLOAT else "fp32") + "_src"
    for node in model.graph.node:
        node.output[:] = [inner if o == out.name else o for o in node.output]
        node.input[:] = [inner if i == out.name else i for i in node.input]
    model.graph.node.append(helper.make_node("Cast", [inner], [out.name], name=out.name + "_cast", to=elem))
    out.type.tensor_type.elem_type = elem

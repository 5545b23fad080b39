"""The wasm twin of a quantized graph (decoder or encoder): the same graph and the same weights file,
with the int4 operators that onnxruntime-web's wasm (CPU) build lacks or runs slowly spelt in
standard ops.

- GatherBlockQuantized (the int4 or int8 embedding lookup) has no kernel in the 1.30 wasm build: the
  twin gathers the packed uint8 rows and unpacks only those.
- MatMulNBits has a kernel there but a slow one: 2.5 ms for a 256x768 int4 weight at one token,
  about 40x the float MatMul (webbuild/tools/bench/steps.mjs, BENCHMARKS.md). With `fold_matmuls` the
  twin dequantizes each weight with Cast/Div/Mul/Sub/Reshape/Transpose over its packed initializer:
  every input is a constant, so onnxruntime folds it into a float32 weight once, at session creation.
  The download stays int4, but the folding costs wasm memory many times the float32 weights
  (webbuild.pipeline.wasm_budget), so the build folds only where its estimate says the result fits.

Nibbles are unpacked low first with the symmetric zero point 8 (128 for 8-bit codes), as the quantize
stage packs them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper

from webbuild.errors import BuildError
from webbuild.graph.load import load_onnx

_C = "wasm_twin/"  # shared constants


def twin_name(name: str) -> str:
    """decoder.fp32.onnx -> decoder.fp32.wasm.onnx"""
    return name.removesuffix(".onnx") + ".wasm.onnx"


def wasm_graph(src: Path, dest: Path, fold_matmuls: bool = True) -> bool:
    """Write `dest`: `src` with GatherBlockQuantized lookups (and, with `fold_matmuls`, MatMulNBits) spelt
    in standard ops; False (nothing written) when there is none."""
    model = load_onnx(src)
    nodes = list(model.graph.node)
    lookups = [n for n in nodes if n.op_type == "GatherBlockQuantized"]
    matmuls = [n for n in nodes if n.op_type == "MatMulNBits"] if fold_matmuls else []
    if not lookups and not matmuls:
        return False
    extra: list[onnx.TensorProto] = []
    dtypes = {t.name: t.data_type for t in model.graph.initializer}
    for node in lookups + matmuls:
        at = nodes.index(node)
        scales_type = dtypes.get(node.input[2], onnx.TensorProto.FLOAT)
        replace = _lookup_nodes if node.op_type == "GatherBlockQuantized" else _matmul_nodes
        new, consts = replace(src, node, scales_type)
        nodes[at:at + 1] = new
        extra += consts
    model.graph.ClearField("node")
    model.graph.node.extend(nodes)
    shared = [("sixteen", 16, np.int32), ("eight", 8, np.int32), ("last", [-1], np.int64), ("zero", [0], np.int64)]
    if any(_attrs(n).get("bits", 4) == 8 for n in lookups):
        shared.append(("one_two_eight", 128, np.int32))  # 8-bit codes' zero point
    model.graph.initializer.extend([onnx.numpy_helper.from_array(np.array(v, dtype), _C + name)
                                    for name, v, dtype in shared] + extra)
    onnx.save(model, str(dest))
    return True


def foldable(model: onnx.ModelProto) -> bool:
    """Whether every MatMulNBits of `model` is a kind the twin can spell in standard ops (4-bit, symmetric,
    no g_idx or bias): else only the form that keeps them runs on wasm."""
    return all(_matmul_foldable(n) for n in model.graph.node if n.op_type == "MatMulNBits")


def _matmul_foldable(mm: onnx.NodeProto) -> bool:
    return _attrs(mm).get("bits", 4) == 4 and not any(mm.input[3:])


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _nibbles(p: str, packed: str) -> list[onnx.NodeProto]:
    """uint8 `packed` [..., n] -> int32 `p`pairs [..., n, 2]: (low, high) nibbles."""
    n = onnx.helper.make_node
    return [
        n("Cast", [packed], [p + "bytes"], to=onnx.TensorProto.INT32),
        n("Div", [p + "bytes", _C + "sixteen"], [p + "high"]),
        n("Mul", [p + "high", _C + "sixteen"], [p + "high16"]),
        n("Sub", [p + "bytes", p + "high16"], [p + "low"]),
        n("Unsqueeze", [p + "low", _C + "last"], [p + "low1"]),
        n("Unsqueeze", [p + "high", _C + "last"], [p + "high1"]),
        n("Concat", [p + "low1", p + "high1"], [p + "pairs"], axis=-1),
    ]


def _lookup_nodes(src: Path, gbq: onnx.NodeProto, scales_type: int) -> tuple[list[onnx.NodeProto], list]:
    a = _attrs(gbq)
    bits = a.get("bits", 4)
    if bits not in (4, 8) or a.get("gather_axis", 0) != 0 or len(gbq.input) > 3:
        raise BuildError(f"{src}: {gbq.name}: only 4- or 8-bit symmetric row lookups can be rewritten for wasm")
    data, ids, scales = gbq.input[:3]
    p = f"{_C}{gbq.name}/"
    n = onnx.helper.make_node
    return [
        n("Gather", [data, ids], [p + "packed"], axis=0),           # [B, S, blocks, block * bits / 8] uint8
        *(_unpacked_rows(p) if bits == 4 else [n("Cast", [p + "packed"], [p + "codes"], to=onnx.TensorProto.INT32)]),
        n("Sub", [p + "codes", _C + ("eight" if bits == 4 else "one_two_eight")], [p + "centred"]),
        n("Gather", [scales, ids], [p + "scales"], axis=0),                      # [B, S, blocks, 1]
        n("Cast", [p + "centred"], [p + "values"], to=scales_type),
        n("Mul", [p + "values", p + "scales"], [gbq.output[0]]),
    ], []


def _unpacked_rows(p: str) -> list[onnx.NodeProto]:
    """Gathered 4-bit rows `p`packed [B, S, blocks, block/2] -> int32 `p`codes [B, S, blocks, block]."""
    n = onnx.helper.make_node
    return [
        *_nibbles(p, p + "packed"),
        n("Shape", [p + "packed"], [p + "shape"]),
        n("Slice", [p + "shape", _C + "zero", _C + "last"], [p + "lead"]),
        n("Concat", [p + "lead", _C + "last"], [p + "unpacked_shape"], axis=0),
        n("Reshape", [p + "pairs", p + "unpacked_shape"], [p + "codes"]),
    ]


def _matmul_nodes(src: Path, mm: onnx.NodeProto, scales_type: int) -> tuple[list[onnx.NodeProto], list]:
    """MatMulNBits(A, B, scales) -> MatMul(A, W) with W [K, N] dequantized from B [N, blocks, bs/2]."""
    a = _attrs(mm)
    k, width, bs = a["K"], a["N"], a["block_size"]
    if not _matmul_foldable(mm):
        raise BuildError(f"{src}: {mm.name}: only 4-bit symmetric MatMulNBits without zero points, g_idx "
                            "or bias can be rewritten for wasm")
    blocks = -(-k // bs)
    p = f"{_C}{mm.name}/"
    shapes = [onnx.numpy_helper.from_array(np.array(v, np.int64), p + name) for name, v in (
        ("codes_shape", [width, blocks, bs]), ("scales_shape", [width, blocks, 1]),
        ("rows_shape", [width, blocks * bs]), ("k", [k]))]
    n = onnx.helper.make_node
    return [
        *_nibbles(p, mm.input[1]),
        n("Reshape", [p + "pairs", p + "codes_shape"], [p + "codes"]),
        n("Sub", [p + "codes", _C + "eight"], [p + "centred"]),
        n("Reshape", [mm.input[2], p + "scales_shape"], [p + "scales"]),
        n("Cast", [p + "centred"], [p + "values"], to=scales_type),  # Cast, not CastLike: CPU folds only kernels
        n("Mul", [p + "values", p + "scales"], [p + "blocks"]),
        n("Reshape", [p + "blocks", p + "rows_shape"], [p + "rows"]),             # [N, blocks * bs]
        n("Slice", [p + "rows", _C + "zero", p + "k", _C + "last"], [p + "rows_k"]),  # padding past K off
        n("Transpose", [p + "rows_k"], [p + "weight"], perm=[1, 0]),               # [K, N]
        n("MatMul", [mm.input[0], p + "weight"], [mm.output[0]]),
    ], shapes

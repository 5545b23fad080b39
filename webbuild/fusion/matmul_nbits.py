"""Blocked int4 DequantizeLinear + MatMul -> com.microsoft.MatMulNBits.

The opset-21 spelling of a 4-bit weight, W[K, N] = DequantizeLinear(q[K, N] (u)int4, scale[K/bs, N],
zero_point, axis=0, block_size=bs), packed into MatMulNBits' layout: B uint8 [N, K/bs, bs/2] (two
values a byte, low nibble first), scales [N * K/bs], zero points packed likewise (omitted when
all are the default 8). Runs before the cleanup pass, which would otherwise fold the dequantization
into a float weight.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir

from webbuild.graph.ir import MS, attr, const, import_ms_domain, new_const, prod, replace
from webbuild.fusion.report import Report

RULE = "matmul_nbits"
ACCURACY_KEY = "webbuild.accuracy_level"  # carried by decompose so a round trip keeps it


def apply(model: ir.Model, report: Report) -> int:
    g, done = model.graph, 0
    for mm in [n for n in g if n.op_type == "MatMul"]:
        dq = prod(mm.inputs[1], "DequantizeLinear")
        if dq is None:
            continue
        parts = _weights(dq)
        if isinstance(parts, str):
            report.miss(RULE, dq.name or "DequantizeLinear", parts)
            continue
        _rewrite(g, mm, dq, *parts)
        done += 1
    report.hit(RULE, done) if done else None
    return done


def _weights(dq: ir.Node):
    q, scale = const(dq.inputs[0]), const(dq.inputs[1])
    zp = const(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2] is not None else None
    bs = attr(dq, "block_size", 0)
    if q is None or scale is None or q.ndim != 2 or attr(dq, "axis", 1) != 0 or not bs:
        return "not a constant 2-D weight blocked along K"
    if q.dtype not in (ml_dtypes.int4, ml_dtypes.uint4) or bs % 2 or bs < 16:
        return f"{q.dtype} weights or block size {bs} (MatMulNBits packs 4-bit, blocks >= 16)"
    shift = 8 if q.dtype == ml_dtypes.int4 else 0  # MatMulNBits stores unsigned nibbles
    unsigned = q.astype(np.int16) + shift
    # DequantizeLinear's missing zero point is 0 (8 once shifted for int4; uint4 needs an explicit 0)
    zero = (zp.astype(np.int16) if zp is not None else np.zeros(scale.shape, np.int16)) + shift
    return unsigned.astype(np.uint8), scale, zero, bs


def _pack_pairs(values: np.ndarray) -> np.ndarray:
    """uint8 values in 0..15 along the last axis -> bytes (low nibble first); odd length padded."""
    if values.shape[-1] % 2:
        values = np.concatenate([values, np.zeros((*values.shape[:-1], 1), np.uint8)], axis=-1)
    return (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)


def _rewrite(g: ir.Graph, mm: ir.Node, dq: ir.Node, q: np.ndarray, scale: np.ndarray, zero, bs: int) -> None:
    import_ms_domain(g)
    k, n = q.shape
    blocks = -(-k // bs)
    padded = np.zeros((blocks * bs, n), np.uint8)
    padded[:k] = q
    b = _pack_pairs(padded.T.reshape(n, blocks, bs))            # [N, blocks, bs/2]
    inputs = [mm.inputs[0], new_const(g, f"{dq.name}.B", b),
              new_const(g, f"{dq.name}.scales", np.ascontiguousarray(scale.T).reshape(-1))]
    if not np.all(zero == 8):  # 8 is MatMulNBits' default
        inputs.append(new_const(g, f"{dq.name}.zero_points", _pack_pairs(zero.T.astype(np.uint8)).reshape(-1)))
    level = int(dq.metadata_props.get(ACCURACY_KEY, 0))
    node = ir.node("MatMulNBits", inputs, {"K": k, "N": n, "bits": 4, "block_size": bs, "accuracy_level": level},
                   domain=MS, name=(mm.name or "MatMul") + "/MatMulNBits")
    node.outputs[0].type, node.outputs[0].shape = mm.outputs[0].type, mm.outputs[0].shape
    g.insert_after(mm, node)
    replace(mm.outputs[0], node.outputs[0])

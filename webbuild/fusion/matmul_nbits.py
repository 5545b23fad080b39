"""Blocked int4 DequantizeLinear + MatMul -> com.microsoft.MatMulNBits.

The opset-21 spelling of a 4-bit weight, W[K, N] = DequantizeLinear(q[K, N] (u)int4, scale[K/bs, N],
zero_point, axis=0, block_size=bs), packed into MatMulNBits' layout: B uint8 [N, K/bs, bs/2] (two
values a byte, low nibble first), scales [N * K/bs], zero points packed likewise (omitted when
all are the default 8). Runs before the cleanup pass, which would otherwise fold the dequantization
into a float weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx_ir as ir

from webbuild.fusion.rule import Miss, Rule
from webbuild.graph.ir import MS, attr, const, import_ms_domain, new_const, prod, replace

ACCURACY_KEY = "webbuild.accuracy_level"  # carried by decompose so a round trip keeps it


@dataclass
class _Match:
    matmul: ir.Node
    dq: ir.Node


def match(mm: ir.Node) -> _Match | Miss | None:
    dq = prod(mm.inputs[1], "DequantizeLinear")
    if dq is None:
        return None
    why = _unfit(dq)
    return Miss(why, dq.name or "DequantizeLinear") if why else _Match(mm, dq)


def _unfit(dq: ir.Node) -> str | None:
    q, scale, bs = const(dq.inputs[0]), const(dq.inputs[1]), attr(dq, "block_size", 0)
    if q is None or scale is None or q.ndim != 2 or attr(dq, "axis", 1) != 0 or not bs:
        return "not a constant 2-D weight blocked along K"
    if q.dtype not in (ml_dtypes.int4, ml_dtypes.uint4) or bs % 2 or bs < 16:
        return f"{q.dtype} weights or block size {bs} (MatMulNBits packs 4-bit, blocks >= 16)"
    return None


def _nibbles(dq: ir.Node) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(q, scale, zero points, block size), q and zero points as unsigned nibbles."""
    q, scale = const(dq.inputs[0]), const(dq.inputs[1])
    zp = const(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2] is not None else None
    shift = 8 if q.dtype == ml_dtypes.int4 else 0  # MatMulNBits stores unsigned nibbles
    unsigned = q.astype(np.int16) + shift
    # DequantizeLinear's missing zero point is 0 (8 once shifted for int4; uint4 needs an explicit 0)
    zero = (zp.astype(np.int16) if zp is not None else np.zeros(scale.shape, np.int16)) + shift
    return unsigned.astype(np.uint8), scale, zero, attr(dq, "block_size", 0)


def _pack_pairs(values: np.ndarray) -> np.ndarray:
    """uint8 values in 0..15 along the last axis -> bytes (low nibble first); odd length padded."""
    if values.shape[-1] % 2:
        values = np.concatenate([values, np.zeros((*values.shape[:-1], 1), np.uint8)], axis=-1)
    return (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)


def _rewrite(g: ir.Graph, m: _Match) -> None:
    import_ms_domain(g)
    mm, dq = m.matmul, m.dq
    q, scale, zero, bs = _nibbles(dq)
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


RULE = Rule("matmul_nbits", ("MatMul",), match, _rewrite)

"""The uint8 layouts of onnxruntime's quantized contrib ops in numpy: MatMulNBits' weight and
GatherBlockQuantized's table, packed from codes or straight from the bytes a graph stores.

onnxruntime ships quantizers but no Python dequantizer for MatMulNBits, and re-quantization and the
tests need one. Layout (onnxruntime's ContribOperators document, com.microsoft.MatMulNBits): B is uint8
[N, n_blocks, blob], blob = block_size * bits / 8, codes of column n in K order, two 4-bit codes per
byte with the lower k in the low nibble; scales [N, n_blocks] (or flat); zero points optional, uint8
packed like B along the block axis (default 2^(bits-1)) or float ([N * n_blocks], HQQ).

GatherBlockQuantized reads the same uint8 bytes as a table [V, n_blocks, blob] (`LOOKUP_ATTRS`), so
one initializer serves lm_head and the embedding lookup; its scales have the data's rank
([V, n_blocks, 1]) and its zero points one byte per block ([V, n_blocks, 1], the low nibble for
4-bit). ONNX's int4/uint4 tensors are stored two codes a byte, low nibble first, in row-major order:
a [rows, cols] table blocked along cols is already that layout, so `unsigned_bytes` gives
GatherBlockQuantized's table and MatMulNBits' B without unpacking a code.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

# GatherBlockQuantized on data [V, n_blocks, blob]; Any: spread into make_node's keywords, whose named ones are str
LOOKUP_ATTRS: dict[str, Any] = {"gather_axis": 0, "quantize_axis": 2}
INT8_ZERO = 128  # the zero point of the uint8 weights an `int8` wasm twin reads (webbuild.forms.wasm_twin)


def n_blocks(k: int, block_size: int) -> int:
    return -(-k // block_size)


def lookup_scales_shape(rows: int, cols: int, block_size: int) -> list[int]:
    """GatherBlockQuantized's scales (and zero points) for a [rows, cols] table: the data's rank."""
    return [rows, n_blocks(cols, block_size), 1]


def unpack_codes(packed: np.ndarray, bits: int, n: int) -> np.ndarray:
    """uint8 rows [N, ...] -> integer codes [N, bytes * 8 / bits] (low nibble first for 4-bit)."""
    flat = np.asarray(packed, np.uint8).reshape(n, -1)
    if bits == 8:
        return flat.astype(np.int32)
    if bits != 4:
        raise ValueError(f"bits={bits}: only 4 and 8 are handled")
    return np.stack([flat & 0x0F, flat >> 4], axis=-1).reshape(n, -1).astype(np.int32)


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of `unpack_codes`: codes [N, ...] -> uint8 [N, bytes]; an odd count of 4-bit codes per
    row gets a zero high nibble."""
    codes = np.asarray(codes)
    codes = codes.reshape(codes.shape[0], -1)
    if bits == 8:
        return codes.astype(np.uint8)
    if codes.shape[1] % 2:
        codes = np.pad(codes, ((0, 0), (0, 1)))
    pairs = codes.reshape(codes.shape[0], -1, 2).astype(np.uint8)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)


def stored_bytes(t: ir.TensorProtocol) -> np.ndarray:
    """The bytes a tensor stores, as a flat uint8 array: a read-only memory map for external data
    (nothing is read until used), the packed bytes for 4-bit types."""
    if isinstance(t, ir.ExternalTensor):
        if t.nbytes == 0:
            return np.zeros(0, np.uint8)
        return np.memmap(t.path, np.uint8, mode="r", offset=t.offset or 0, shape=(t.nbytes,))
    if isinstance(t, ir.PackedTensor):
        return t.numpy_packed().reshape(-1)
    if t.dtype.bitwidth == 4:
        return np.frombuffer(t.tobytes(), np.uint8)
    return np.asarray(t.numpy()).view(np.uint8).reshape(-1)


def unsigned_bytes(t: ir.TensorProtocol, bits: int, signed: bool) -> np.ndarray:
    """The stored bytes of a tensor of 4- or 8-bit codes as the unsigned codes MatMulNBits and
    GatherBlockQuantized read: unsigned codes as they are (`stored_bytes`, nothing read); int4/int8
    codes plus 2^(bits-1), which flips each code's top bit, in one array: external data is read into it
    (no memory map left resident beside it) and flipped in place."""
    if not signed:
        return stored_bytes(t)
    if isinstance(t, ir.ExternalTensor):
        out = np.empty(t.nbytes, np.uint8)
        with open(t.path, "rb") as f:
            f.seek(t.offset or 0)
            if f.readinto(out.data) != t.nbytes:
                raise ValueError(f"{t.path}: shorter than tensor {t.name!r} says")
    else:
        out = stored_bytes(t).copy()
    return np.bitwise_xor(out, np.uint8(0x88 if bits == 4 else 0x80), out=out)


def zero_points(zp: np.ndarray | None, bits: int, n: int, blocks: int) -> np.ndarray:
    """Zero points as float [N, n_blocks], whatever form they were stored in."""
    if zp is None:
        return np.full((n, blocks), 2 ** (bits - 1), np.float32)
    zp = np.asarray(zp)
    if zp.dtype.kind == "f":
        return zp.astype(np.float32).reshape(n, blocks)
    return unpack_codes(zp, bits, n)[:, :blocks].astype(np.float32)


def dequantize(packed: np.ndarray, scales: np.ndarray, zp: np.ndarray | None, k: int, n: int, bits: int,
               block_size: int) -> np.ndarray:
    """The float32 weight [K, N] that MatMulNBits multiplies by."""
    blocks = n_blocks(k, block_size)
    codes = unpack_codes(packed, bits, n)[:, :blocks * block_size].reshape(n, blocks, block_size)
    zero = zero_points(zp, bits, n, blocks)
    scale = np.asarray(scales, np.float32).reshape(n, blocks)
    w = (codes - zero[..., None]) * scale[..., None]
    return np.ascontiguousarray(w.reshape(n, -1)[:, :k].T, dtype=np.float32)


def int8_codes(packed: np.ndarray, scales: np.ndarray, k: int, n: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """int4 codes [N, blocks, block/2] and float32 scales [N * blocks] -> (uint8 weight [K, N] with zero
    point 128, float32 column scales [N]). Per column the int4 block values c * s are mapped onto
    -127..127 by the column's largest scale m: q = floor(c * 15.875 * (s / m) + 0.5) (15.875 = 127 / 8,
    |c| <= 8), in float64, as runtime/int8.js computes it; the column's scale is 8 m / 127."""
    blocks = -(-k // block)
    s = np.asarray(scales, np.float32).reshape(n, blocks).astype(np.float64)
    m = np.abs(s).max(axis=1, keepdims=True)
    ratio = np.divide(s, m, out=np.zeros_like(s), where=m > 0)  # [N, blocks]
    codes = np.arange(16, dtype=np.float64) - 8  # every code value, for a table per block
    table = np.floor(codes * 15.875 * ratio[..., None] + 0.5) + INT8_ZERO  # [N, blocks, 16]
    b = np.asarray(packed, np.uint8).reshape(n, blocks, block // 2)
    pairs = np.stack([b & 15, b >> 4], axis=-1).reshape(n, blocks, block)  # low nibble first
    q = np.take_along_axis(table, pairs.astype(np.intp), axis=2).reshape(n, blocks * block)[:, :k]
    col = (m[:, 0] * 8 / 127).astype(np.float32)
    return np.ascontiguousarray(q.T.astype(np.uint8)), col


def int8_weights(plan: dict, weights: np.ndarray) -> np.ndarray:
    """The bytes of `plan`'s derived weights file (webbuild.forms.wasm_twin.Int8Plan as written), from its source's
    bytes: what the page derives at load (runtime/int8.js) and the Python reference's session reads."""
    out = np.zeros(plan["bytes"], np.uint8)
    for t in plan["tensors"]:
        (co, cl), (so, sl) = t["codes"], t["scales"]
        scales = np.frombuffer(np.asarray(weights[so:so + sl]).tobytes(), "<f4")
        q, _ = int8_codes(weights[co:co + cl], scales, t["k"], t["n"], t["block"])
        out[t["at"]:t["at"] + q.size] = q.reshape(-1)
    return out

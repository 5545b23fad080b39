"""MatMulNBits weight layout in numpy: unpack codes, dequantize to the float [K, N] matrix.

onnxruntime ships quantizers but no Python dequantizer for MatMulNBits, and re-quantization and the
tests need one. Layout (docs/ContribOperators.md, com.microsoft.MatMulNBits): B is uint8
[N, n_blocks, blob], blob = block_size * bits / 8, codes of column n in K order, two 4-bit codes per
byte with the lower k in the low nibble; scales [N, n_blocks] (or flat); zero points optional, uint8
packed like B along the block axis (default 2^(bits-1)) or float ([N * n_blocks], HQQ).
"""

from __future__ import annotations

import numpy as np


def n_blocks(k: int, block_size: int) -> int:
    return -(-k // block_size)


def unpack_codes(packed: np.ndarray, bits: int, n: int) -> np.ndarray:
    """uint8 rows [N, ...] -> integer codes [N, bytes * 8 / bits] (low nibble first for 4-bit)."""
    flat = np.asarray(packed, np.uint8).reshape(n, -1)
    if bits == 8:
        return flat.astype(np.int32)
    if bits != 4:
        raise ValueError(f"bits={bits}: only 4 and 8 are handled")
    return np.stack([flat & 0x0F, flat >> 4], axis=-1).reshape(n, -1).astype(np.int32)


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of `unpack_codes` for an even number of 4-bit codes per row."""
    codes = np.asarray(codes)
    if bits == 8:
        return codes.astype(np.uint8)
    pairs = codes.reshape(codes.shape[0], -1, 2).astype(np.uint8)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)


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

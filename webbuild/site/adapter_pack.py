"""An adapter's shipped file (docs/adapters.md): the adapted decoder graph's `lora.*` inputs, packed.

The build packs a PEFT folder into one file plus its manifest entry; the Python reference unpacks it
(the browser's runtime/lora.js reads the same layout). `int8` is MatMulNBits' 8-bit layout: each
column of a [K, N] input quantized in blocks of 32 along K, symmetric (zero point 128), float32 scales.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from webbuild.adapters import CONFIG, TARGET_MODULES, WEIGHTS, read_tensors, tensor_name, update_scale
from webbuild.site.contract import IO

BLOCK = 32
ZERO_POINT = 128
PRECISIONS = {"int8": None, "fp16": np.float16, "fp32": np.float32}  # the stored type of unquantized ones


def graph_inputs(folder: Path, num_layers: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    """{graph input: float32 [K, N]} of a PEFT folder: down = A^T, up = (B * PEFT's factor * scale)^T, the
    factor lora_alpha / r (lora_alpha / sqrt(r) with use_rslora)."""
    factor = update_scale(json.loads((folder / CONFIG).read_text())) * scale
    tensors = read_tensors(folder / WEIGHTS)
    inputs = {}
    for layer in range(num_layers):
        for proj in TARGET_MODULES:
            a, b = tensors[tensor_name(layer, proj, "A")], tensors[tensor_name(layer, proj, "B")]
            inputs[IO.lora_input(layer, proj, "down")] = np.ascontiguousarray(a.T)
            inputs[IO.lora_input(layer, proj, "up")] = np.ascontiguousarray((b * factor).T)
    return inputs


def quantize_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[K, N] float -> (codes uint8 [N, blocks, 32], scales float32 [N, blocks])."""
    k, n = w.shape
    blocks = -(-k // BLOCK)
    cols = np.zeros((n, blocks * BLOCK), np.float32)
    cols[:, :k] = w.T
    cols = cols.reshape(n, blocks, BLOCK)
    scales = np.abs(cols).max(axis=2) / 127
    safe = np.where(scales > 0, scales, 1)[..., None]
    codes = np.clip(np.rint(cols / safe), -127, 127) + ZERO_POINT
    return codes.astype(np.uint8), scales.astype(np.float32)


def dequantize_int8(codes: np.ndarray, scales: np.ndarray, k: int) -> np.ndarray:
    """The inverse of quantize_int8: float32 [K, N]."""
    cols = (codes.astype(np.float32) - ZERO_POINT) * scales[..., None]
    return np.ascontiguousarray(cols.reshape(codes.shape[0], -1)[:, :k].T)


def pack(inputs: dict[str, np.ndarray], precision: str) -> tuple[bytes, dict[str, dict]]:
    """The file's bytes and its manifest `tensors` entry ({input: shape, offset[, scales_offset]})."""
    parts, table, offset = [], {}, 0
    for name, w in inputs.items():
        entry = table[name] = {"shape": list(w.shape), "offset": offset}
        if precision == "int8":
            codes, scales = quantize_int8(w)
            entry["scales_offset"] = offset + codes.nbytes  # a multiple of 32
            chunks = [codes.tobytes(), scales.tobytes()]
        else:
            chunks = [w.astype(PRECISIONS[precision]).tobytes()]
        for chunk in chunks:
            padded = chunk + bytes(-len(chunk) % 4)  # every offset a multiple of 4 (typed-array views)
            parts.append(padded)
            offset += len(padded)
    return b"".join(parts), table


def unpack(data: bytes, tensors: dict[str, dict], precision: str) -> dict[str, np.ndarray]:
    """{input: float32 [K, N]} from a packed file and its `tensors` entry."""
    out = {}
    for name, entry in tensors.items():
        k, n = entry["shape"]
        if precision == "int8":
            blocks = -(-k // BLOCK)
            codes = np.frombuffer(data, np.uint8, n * blocks * BLOCK, entry["offset"]).reshape(n, blocks, BLOCK)
            scales = np.frombuffer(data, np.float32, n * blocks, entry["scales_offset"]).reshape(n, blocks)
            out[name] = dequantize_int8(codes, scales, k)
        else:
            dtype = PRECISIONS[precision]
            out[name] = np.frombuffer(data, dtype, k * n, entry["offset"]).reshape(k, n).astype(np.float32)
    return out

"""An adapter's shipped file (docs/adapters.md): the adapted decoder graph's `lora.*` inputs, packed.

The build packs a PEFT folder into one file plus its manifest entry; the Python reference unpacks it
(the browser's runtime/lora.js reads the same layout). `int8` is MatMulNBits' 8-bit layout: each
column of a [K, N] input quantized in blocks of 32 along K, symmetric (zero point 128), float32 scales.
Only the rows outside which an input is zero are stored (`rows`): an up matrix holds its projection's rows of
its group's shared rank (webbuild.adapters.DOWN_GROUPS), and the zeros would triple the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from webbuild.adapters import CONFIG, DOWN_GROUPS, WEIGHTS, read_tensors, shared_rank, tensor_name, update_scale
from webbuild.site.contract import (
    DELTA_BITS,
    DELTA_CODES,
    DELTA_GROUPS,
    DELTA_SCALES,
    DOWN_BITS,
    DOWN_CODES,
    DOWN_SCALES,
    IO,
    JOINT_CODES,
    JOINT_SCALES,
    PACKED_UPS,
    UP_CODES,
    UP_SCALES,
)

BLOCK = 32
ZERO_POINT = 128
IDENTITY_CODE = 64  # an 8-bit identity's ones: code 128 + 64 at scale 1/64, both exact in float16 too (joint_up)
PRECISIONS = {"int8": None, "fp16": np.float16, "fp32": np.float32}  # the stored type of unquantized ones


def graph_inputs(folder: Path, num_layers: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    """{graph input: float32 [K, N]} of a PEFT folder, a layer's in DOWN_GROUPS order: a group's down = its
    projections' A^T side by side, then each projection's up = (B * PEFT's factor * scale)^T in its own rows of
    the group's rank (zeros elsewhere), the factor lora_alpha / r (lora_alpha / sqrt(r) with use_rslora)."""
    factor = update_scale(json.loads((folder / CONFIG).read_text())) * scale
    tensors = read_tensors(folder / WEIGHTS)
    inputs = {}
    for layer in range(num_layers):
        for group, projs in DOWN_GROUPS.items():
            downs = [tensors[tensor_name(layer, proj, "A")].T for proj in projs]
            inputs[IO.lora_input(layer, group, "down")] = np.ascontiguousarray(np.concatenate(downs, axis=1))
            rank, start = sum(d.shape[1] for d in downs), 0
            for proj, down in zip(projs, downs):
                b = tensors[tensor_name(layer, proj, "B")]
                up = inputs[IO.lora_input(layer, proj, "up")] = np.zeros((rank, b.shape[0]), np.float32)
                up[start:start + down.shape[1]] = (b * factor).T
                start += down.shape[1]
    return inputs


def update(inputs: dict[str, np.ndarray], layer: int, proj: str) -> np.ndarray:
    """The [in, out] update the graph inputs make to one projection: its group's down times its up."""
    group = next(g for g, projs in DOWN_GROUPS.items() if proj in projs)
    return inputs[IO.lora_input(layer, group, "down")] @ inputs[IO.lora_input(layer, proj, "up")]


def stored_rows(w: np.ndarray) -> tuple[int, int]:
    """[start, stop) of the rows of `w` outside which it is zero: what the file keeps of it (an up matrix is
    zero outside its projection's rows of the group's rank)."""
    nonzero = np.flatnonzero(np.any(w != 0, axis=1))
    return (int(nonzero[0]), int(nonzero[-1]) + 1) if nonzero.size else (0, 0)


def quantize_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[K, N] float -> (codes uint8 [N, blocks, 32], scales float32 [N, blocks])."""
    return quantize_blocks(w, 8)


def quantize_blocks(w: np.ndarray, bits: int, block: int = BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """[K, N] float -> MatMulNBits' symmetric `bits`-bit layout (8 or 4): codes uint8 [N, blocks, block * bits / 8]
    (4-bit codes two to a byte, the lower nibble first) and scales float32 [N, blocks], each column quantized in
    blocks of `block` along K (K padded with zeros), scale = the block's largest magnitude / (2^(bits-1) - 1), code =
    the value / scale rounded half to even + the zero point 2^(bits-1)."""
    k, n = w.shape
    per_byte = 8 // bits
    if k == 0:  # an input of zeros: nothing stored
        return np.zeros((n, 0, block // per_byte), np.uint8), np.zeros((n, 0), np.float32)
    blocks, top = -(-k // block), 2 ** (bits - 1) - 1
    cols = np.zeros((n, blocks * block), np.float32)
    cols[:, :k] = w.T
    cols = cols.reshape(n, blocks, block)
    scales = np.abs(cols).max(axis=2) / np.float32(top)
    safe = np.where(scales > 0, scales, 1)[..., None]
    codes = (np.clip(np.rint(cols / safe), -top, top) + (top + 1)).astype(np.uint8)
    if bits == 4:
        codes = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return codes, scales.astype(np.float32)


def step_downs(inputs: dict[str, np.ndarray], dtype=np.float32) -> dict[str, np.ndarray]:
    """{input: value} of the downs as the adapted step form reads them (webbuild.pipeline.lora_form.quantized_downs and
    packed_updates): each group's down [in, R] of `inputs` (graph_inputs' form; [in, 0] for no adapter) padded
    with zero columns to the build's rank for the group, then quantize_blocks' codes in down_bits, and its
    scales in `dtype`, the graph's float type. runtime/lora.js stepDowns computes the same."""
    out = {}
    for name, down in inputs.items():
        parts = IO.lora_parts(name)
        if parts is None or parts[2] != "down":
            continue
        layer, group, _ = parts
        padded = np.zeros((down.shape[0], shared_rank(group)), np.float32)
        padded[:, :down.shape[1]] = down
        codes, scales = quantize_blocks(padded, down_bits(group))
        out[IO.lora_input(layer, group, DOWN_CODES)] = codes
        out[IO.lora_input(layer, group, DOWN_SCALES)] = scales.astype(dtype)
    return out


def joint_inputs(inputs: dict[str, np.ndarray], table: dict[str, dict], weights: np.ndarray,
                 dtype=np.float32) -> dict[str, np.ndarray]:
    """{input: value} of the JOINT_DOWNS groups' inputs as the adapted step form reads them
    (webbuild.pipeline.lora_form.joint_downs), for its `table` (the step graph's JOINT_KEY metadata, the manifest
    variant's `lora_joint`), the decoder's weights file as uint8 `weights`, and `inputs` in graph_inputs' form (no
    adapter: empty or absent). runtime/lora.js computes the same (the base rows it copies at load)."""
    out = {}
    for key, e in table.items():
        layer, group = int(key.split(".")[1]), key.split(".")[2]
        (proj,) = DOWN_GROUPS[group]
        codes, scales = joint_base(e, weights, dtype)
        down = joint_down(inputs.get(IO.lora_input(layer, group, "down")), e)
        codes[e["rows"]:], scales[e["rows"]:] = down[0], down[1].astype(dtype)
        out[IO.lora_input(layer, group, JOINT_CODES)], out[IO.lora_input(layer, group, JOINT_SCALES)] = codes, scales
        up_codes, up_scales = joint_up(inputs.get(IO.lora_input(layer, proj, "up")), e)
        out[IO.lora_input(layer, proj, UP_CODES)], out[IO.lora_input(layer, proj, UP_SCALES)] = \
            up_codes, up_scales.astype(dtype)
    return out


def joint_base(e: dict, weights: np.ndarray, dtype) -> tuple[np.ndarray, np.ndarray]:
    """A joint's codes [rows + rank, blocks, block * bits / 8] and scales [rows + rank, blocks] holding the base
    projection's (from the weights file) and zero codes and scales after them."""
    per_row = e["block"] * e["bits"] // 8
    (at, length), (scales_at, scales_length) = e["codes"], e["scales"]
    total, zero = e["rows"] + e["rank"], 2 ** (e["bits"] - 1)
    codes = np.full((total, e["blocks"], per_row), zero | (zero << 4) if e["bits"] == 4 else zero, np.uint8)
    codes[:e["out"]] = weights[at:at + length].reshape(e["out"], e["blocks"], per_row)
    scales = np.zeros((total, e["blocks"]), dtype)
    scales[:e["out"]] = weights[scales_at:scales_at + scales_length].view(dtype).reshape(e["out"], e["blocks"])
    return codes, scales


def joint_down(down: np.ndarray | None, e: dict) -> tuple[np.ndarray, np.ndarray]:
    """A down [in, R] (None: no adapter) as a joint's last `rank` rows: codes and float32 scales in the base
    projection's bits and blocks, zero columns up to `rank`."""
    padded = np.zeros((e["in"], e["rank"]), np.float32)
    if down is not None:
        padded[:, :down.shape[1]] = down
    return quantize_blocks(padded, e["bits"], e["block"])


def joint_up(up: np.ndarray | None, e: dict) -> tuple[np.ndarray, np.ndarray]:
    """An up [R, out] (None: no adapter) as the 8-bit weights [rows + rank, out] that add it: an identity over the
    first `out` rows (code 192 at scale 1/64, exactly 1), the up's codes and float32 scales from row `rows` on."""
    padded = np.zeros((e["rank"], e["out"]), np.float32)
    if up is not None:
        padded[:up.shape[0]] = up
    codes, scales = quantize_blocks(padded, 8)
    n, eye_blocks = e["out"], e["rows"] // BLOCK
    eye = np.full((n, eye_blocks * BLOCK), ZERO_POINT, np.uint8)
    eye[np.arange(n), np.arange(n)] = ZERO_POINT + IDENTITY_CODE
    eye_scales = np.full((n, eye_blocks), 1 / IDENTITY_CODE, np.float32)
    return np.concatenate([eye.reshape(n, eye_blocks, BLOCK), codes], axis=1), np.concatenate([eye_scales, scales], 1)


def delta_inputs(inputs: dict[str, np.ndarray], dtype=np.float32) -> dict[str, np.ndarray]:
    """{input: value} of the merged updates the adapted step form reads (webbuild.pipeline.lora_form.merged_deltas):
    each DELTA_GROUPS member's down @ up of `inputs` (graph_inputs' form, no adapter: empty) in `dtype` (the graph's
    float type, as the page holds them), multiplied in float32, quantize_blocks' 4-bit codes and scales in `dtype`.
    The page computes the same with the delta graph (webbuild.pipeline.lora_delta), up to the order of the sums."""
    out = {}
    for name, down in inputs.items():
        parts = IO.lora_parts(name)
        if parts is None or parts[1] not in DELTA_GROUPS or parts[2] != "down":
            continue
        layer, group, _ = parts
        for proj in DOWN_GROUPS[group]:
            up = inputs[IO.lora_input(layer, proj, "up")]
            product = down.astype(dtype).astype(np.float32) @ up.astype(dtype).astype(np.float32)
            codes, scales = quantize_blocks(product, DELTA_BITS)
            out[IO.lora_input(layer, proj, DELTA_CODES)] = codes
            out[IO.lora_input(layer, proj, DELTA_SCALES)] = scales.astype(dtype)
    return out


def down_bits(group: str) -> int:
    """The bits of a group's down codes in the step form: 4 for a FUSED_DOWNS group (its down rides in a norm's fused
    kernel, which reads 4-bit weights only), 8 for the others; runtime.json's `lora_down_bits`."""
    return DOWN_BITS[group]


def packed_ups(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """{input: value} of the ups the adapted step form reads as one per layer and PACKED_UPS group
    (webbuild.pipeline.lora_form.packed_updates): the members' ups of `inputs` side by side. runtime/lora.js
    LoraInputs writes the same."""
    out: dict[str, np.ndarray] = {}
    layers = {parts[0] for name in inputs if (parts := IO.lora_parts(name)) is not None}
    for layer, group in ((layer, group) for layer in sorted(layers) for group in PACKED_UPS):
        names = [IO.lora_input(layer, proj, "up") for proj in DOWN_GROUPS[group]]
        if all(name in inputs for name in names):
            out[IO.lora_input(layer, group, "up")] = np.concatenate([inputs[name] for name in names], axis=1)
    return out


def dequantize_int8(codes: np.ndarray, scales: np.ndarray, k: int) -> np.ndarray:
    """The inverse of quantize_int8: float32 [K, N]."""
    cols = (codes.astype(np.float32) - ZERO_POINT) * scales[..., None]
    return np.ascontiguousarray(cols.reshape(codes.shape[0], -1)[:, :k].T)


def pack(inputs: dict[str, np.ndarray], precision: str) -> tuple[bytes, dict[str, dict]]:
    """The file's bytes and its manifest `tensors` entry ({input: shape, offset[, scales_offset][, rows]}): each
    input's rows from `rows` [start, stop) on (all of them where `rows` is absent), the rest being zeros."""
    parts, table, offset = [], {}, 0
    for name, full in inputs.items():
        start, stop = stored_rows(full)
        entry = table[name] = {"shape": list(full.shape), "offset": offset}
        if (start, stop) != (0, full.shape[0]):
            entry["rows"] = [start, stop]
        w = full[start:stop]
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


def stored_parameters(tensors: dict[str, dict]) -> int:
    """The values a packed file holds, by its `tensors` entry."""
    total = 0
    for entry in tensors.values():
        start, stop = entry.get("rows", (0, entry["shape"][0]))
        total += (stop - start) * entry["shape"][1]
    return total


def unpack(data: bytes, tensors: dict[str, dict], precision: str) -> dict[str, np.ndarray]:
    """{input: float32 [K, N]} from a packed file and its `tensors` entry."""
    out = {}
    for name, entry in tensors.items():
        k, n = entry["shape"]
        start, stop = entry.get("rows", (0, k))
        rows = stop - start
        full = out[name] = np.zeros((k, n), np.float32)
        if precision == "int8":
            blocks = -(-rows // BLOCK)
            codes = np.frombuffer(data, np.uint8, n * blocks * BLOCK, entry["offset"]).reshape(n, blocks, BLOCK)
            scales = np.frombuffer(data, np.float32, n * blocks, entry["scales_offset"]).reshape(n, blocks)
            full[start:stop] = dequantize_int8(codes, scales, rows)
        else:
            dtype = PRECISIONS[precision]
            full[start:stop] = np.frombuffer(data, dtype, rows * n, entry["offset"]).reshape(rows, n)
    return out

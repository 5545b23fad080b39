"""An adapter's shipped file (docs/adapters.md): the adapted decoder graph's `lora.*` inputs, packed.

The build packs a PEFT folder into one file plus its manifest entry; the Python reference unpacks it
(the browser's runtime/lora.js reads the same layout). `int8` is MatMulNBits' 8-bit layout: each
column of a [K, N] input quantized in blocks of 32 along K, symmetric (zero point 128), float32 scales.
Only the rows outside which an input is zero are stored (`rows`): an up matrix holds its projection's rows of
its group's shared rank (webbuild.adapters.DOWN_GROUPS), and the zeros would triple the file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from webbuild.adapters import CONFIG, DOWN_GROUPS, WEIGHTS, read_tensors, tensor_name, update_scale
from webbuild.site.contract import (
    DELTA_BITS,
    DELTA_CODES,
    DELTA_GROUPS,
    DELTA_SCALES,
    DOWN_BITS,
    IO,
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


def step_inputs(inputs: dict[str, np.ndarray], layout: dict[str, dict],
                weights: Callable[[str], np.ndarray] | None = None, dtype=np.float32) -> dict[str, np.ndarray]:
    """{input: value} of an adapted step graph's lora inputs, each made from the adapter tensors of `inputs`
    (graph_inputs' form; a tensor absent: zeros, no adapter) as its record of `layout` says (the manifest variant's
    `lora_layout`, webbuild.forms.lora.step_layout): codes uint8, scales and values in `dtype` (the graph's
    float type). `weights(location)`: a weights file's bytes as uint8, for a joint's base rows (`base`).
    runtime/lora.js makes the same, bit for bit (a `delta` kind up to the order of its product's sums)."""
    out = {}
    for name, record in layout.items():
        value = ENCODERS[record["kind"]](record, [inputs.get(n) for n in record["from"]], dtype)[record["part"]]
        value = value if record["part"] == "codes" else value.astype(dtype)
        out[name] = _placed(record, value, weights) if record["kind"] == "joint_down" else value
    return out


def _padded(source: np.ndarray | None, k: int, n: int) -> np.ndarray:
    """`source` (None: nothing) in the top left of zeros [k, n], float32."""
    out = np.zeros((k, n), np.float32)
    if source is not None:
        out[:source.shape[0], :source.shape[1]] = source
    return out


def _blocks(record: dict, w: np.ndarray) -> dict[str, np.ndarray]:
    codes, scales = quantize_blocks(w, record["bits"], record["block"])
    return {"codes": codes, "scales": scales}


def _float(record: dict, sources: list, dtype) -> dict[str, np.ndarray]:
    """The adapter's tensor itself."""
    return {"values": _padded(sources[0], *record["dims"])}


def _down(record: dict, sources: list, dtype) -> dict[str, np.ndarray]:
    """A down [in, r] in MatMulNBits blocks, its columns padded to the record's R: codes [R, blocks, ...]."""
    rank, blocks = record["dims"][:2]
    return _blocks(record, _padded(sources[0], blocks * record["block"], rank))


def _packed_up(record: dict, sources: list, dtype) -> dict[str, np.ndarray]:
    """Ups [R, out] side by side."""
    if any(s is None for s in sources):
        return {"values": np.zeros(record["dims"], np.float32)}
    return {"values": np.concatenate(sources, axis=1)}


def _joint_down(record: dict, sources: list, dtype) -> dict[str, np.ndarray]:
    """A down as a joint's last rows (from `rows` on): its codes and scales in the projection's bits and blocks,
    its columns padded to the joint's rank; _placed puts the base rows before them."""
    total, blocks = record["dims"][:2]
    return _blocks(record, _padded(sources[0], blocks * record["block"], total - record["rows"]))


def _placed(record: dict, part: np.ndarray, weights: Callable[[str], np.ndarray] | None) -> np.ndarray:
    """A joint's whole input: the base projection's bytes (its record's `base`, from the weights file), zero codes
    and scales up to row `rows`, then `part`."""
    zero = 2 ** (record["bits"] - 1)
    fill = (zero | (zero << 4) if record["bits"] == 4 else zero) if record["part"] == "codes" else 0
    full = np.full([record["dims"][0], *part.shape[1:]], fill, part.dtype)
    full[record["rows"]:] = part
    base = record["base"]
    if weights is None:
        raise ValueError(f"{', '.join(record['from'])}: a joint's base rows need the weights file {base['location']}")
    full.view(np.uint8).reshape(-1)[:base["length"]] = weights(base["location"])[base["offset"]:][:base["length"]]
    return full


def _joint_up(record: dict, sources: list, dtype) -> dict[str, np.ndarray]:
    """An up [R, out] as the 8-bit weights [rows + rank, out] that add it: an identity over the first `rows` rows
    (code 192 at scale 1/64, exactly 1), the up's codes and scales below it."""
    n, blocks = record["dims"][:2]
    eye_blocks = record["rows"] // BLOCK
    up = _blocks(record, _padded(sources[0], (blocks - eye_blocks) * BLOCK, n))
    eye = np.full((n, eye_blocks * BLOCK), ZERO_POINT, np.uint8)
    eye[np.arange(n), np.arange(n)] = ZERO_POINT + IDENTITY_CODE
    eye_scales = np.full((n, eye_blocks), 1 / IDENTITY_CODE, np.float32)
    return {"codes": np.concatenate([eye.reshape(n, eye_blocks, BLOCK), up["codes"]], axis=1),
            "scales": np.concatenate([eye_scales, up["scales"]], axis=1)}


def _delta(record: dict, sources: list, dtype) -> dict[str, np.ndarray]:
    """down @ up in blocks, multiplied in float32 of the values in `dtype` (as the page holds them)."""
    out, blocks = record["dims"][:2]
    down, up = (s.astype(dtype).astype(np.float32) if s is not None else None for s in sources)
    product = down @ up if down is not None and up is not None else None
    return _blocks(record, _padded(product, blocks * record["block"], out))


# how each kind of step input is made from its adapter tensors (the layout record's `kind`)
ENCODERS = {"float": _float, "down": _down, "packed_up": _packed_up, "joint_down": _joint_down,
            "joint_up": _joint_up, "delta": _delta}


def delta_inputs(inputs: dict[str, np.ndarray], dtype=np.float32) -> dict[str, np.ndarray]:
    """{input: value} of the merged updates the adapted step form reads (webbuild.forms.lora.merged_deltas):
    each DELTA_GROUPS member's down @ up of `inputs` (graph_inputs' form, no adapter: empty) in `dtype` (the graph's
    float type, as the page holds them), multiplied in float32, quantize_blocks' 4-bit codes and scales in `dtype`.
    The page computes the same with the delta graph (webbuild.forms.lora_delta), up to the order of the sums."""
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
    kernel, which reads 4-bit weights only), 8 for the others."""
    return DOWN_BITS[group]


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

"""What a LoRA adapter folder must hold to fit the base model it is built with.

A PEFT-style folder: `adapter_config.json` (`r`, `lora_alpha`, `target_modules`, optionally `use_rslora`)
and `adapter_model.safetensors`, with A [r, in] and B [out, r] for every target projection of every
decoder layer, under PEFT's names. The build takes rank-32 adapters on all seven projections (the shape
the fused rank-32 LoRA kernels of newer runtimes take); the shapes follow from the base's config.json
`decoder` block. PEFT settings that are not a plain B·A·x update (DoRA, trained biases, whole modules
saved, per-module ranks or alphas) are refused by name rather than built into another model. Each
problem is one line naming the adapter and, where there is one, the tensor.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np

RANK = 32
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BLOCK = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
         "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
# The adapted graph's down matrices (webbuild.forms.lora): the projections that read the same input share
# one, their A matrices side by side, so a layer runs four down MatMuls instead of seven; each projection's up
# then has the shared rank's rows, zero outside its own (docs/adapters.md).
DOWN_GROUPS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "o_proj": ("o_proj",),
               "gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}


def shared_rank(owner: str, rank: int = RANK) -> int:
    """The rank of a group's shared down, or of a projection's up (DOWN_GROUPS): `rank` times the group's members."""
    group = owner if owner in DOWN_GROUPS else next(g for g, projs in DOWN_GROUPS.items() if owner in projs)
    return rank * len(DOWN_GROUPS[group])


WEIGHTS, CONFIG = "adapter_model.safetensors", "adapter_config.json"
ENCODER = ".audio_tower."  # in PEFT's names of the audio encoder's tensors
DECODER_TARGETS = r".*language_model.*\.(q|k|v|o|gate|up|down)_proj"  # PEFT's regex form: the decoder's only
FLOAT_DTYPES = ("F32", "F16", "BF16")
MAX_TENSOR_PROBLEMS = 4  # an adapter of another model would list every tensor; the first few say it


# adapter_config.json settings that base + B·A·x cannot express: (key, is it set?, why, and what to do)
UNSUPPORTED = (
    ("use_dora", bool, "DoRA rescales the base weights, which base + B·A·x cannot express; train without use_dora"),
    ("bias", lambda v: v not in (None, "none"), "trains biases the adapted graph has no input for; train with "
                                                "bias='none'"),
    ("modules_to_save", bool, "saves whole modules beside the LoRA matrices; the build ships LoRA matrices only"),
    ("rank_pattern", bool, f"gives some modules their own rank; the build takes rank {RANK} on every projection"),
    ("alpha_pattern", bool, "gives some modules their own lora_alpha; train with one lora_alpha for all"),
    ("fan_in_fan_out", bool, "stores the matrices transposed, for Conv1D layers the decoder does not have"),
)


def update_scale(config: dict) -> float:
    """PEFT's factor on B·A: lora_alpha / r, or lora_alpha / sqrt(r) for rank-stabilised LoRA (use_rslora)."""
    r = config["r"]
    return config["lora_alpha"] / (math.sqrt(r) if config.get("use_rslora") else r)


def tensor_name(layer: int, proj: str, part: str) -> str:
    """PEFT's name of one projection's A or B (`part`) in the text decoder."""
    return f"base_model.model.model.language_model.layers.{layer}.{BLOCK[proj]}.{proj}.lora_{part}.weight"


def projection_shapes(base_config: dict) -> dict[str, tuple[int, int]]:
    """{projection: (out, in)} of the base decoder's layers, from its config.json."""
    d = base_config["decoder"]
    hidden, q, kv = d["hidden_size"], d["num_attention_heads"] * d["head_dim"], d["num_key_value_heads"] * d["head_dim"]
    inter = d["intermediate_size"]
    return {"q_proj": (q, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden), "o_proj": (hidden, q),
            "gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}


def expected_tensors(base_config: dict, rank: int = RANK) -> dict[str, tuple[int, int]]:
    """{tensor name: shape} of a rank-`rank` adapter of the base."""
    shapes = projection_shapes(base_config)
    return {tensor_name(layer, proj, part): ((rank, n_in) if part == "A" else (n_out, rank))
            for layer in range(base_config["decoder"]["num_layers"])
            for proj, (n_out, n_in) in shapes.items() for part in "AB"}


_ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I8": 1, "U8": 1, "I16": 2, "I32": 4, "I64": 8, "BOOL": 1}


def read_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{tensor name: (dtype, shape)} from a safetensors file's JSON header, no tensor read; a ValueError when
    the header is malformed or a tensor's bytes lie past the end of the file (a truncated download)."""
    with path.open("rb") as f:
        raw = f.read(8)
        size = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
        if size <= 0 or size > path.stat().st_size - 8:
            raise ValueError("not a safetensors file (its header size is wrong)")
        header = json.loads(f.read(size))
    if not isinstance(header, dict):
        raise ValueError("not a safetensors file (its header is not a JSON object)")
    data_bytes = path.stat().st_size - 8 - size
    return {k: _entry(k, v, data_bytes) for k, v in header.items() if k != "__metadata__"}


def _entry(name: str, v: object, data_bytes: int) -> tuple[str, tuple[int, ...]]:
    """A header entry's (dtype, shape), its byte range checked against its shape and the file's size."""
    try:
        dtype, shape, (start, end) = v["dtype"], tuple(int(d) for d in v["shape"]), v["data_offsets"]  # type: ignore[index]
        want = math.prod(shape) * _ITEMSIZE[dtype]
    except (TypeError, KeyError, ValueError):
        raise ValueError(f"tensor {name}: malformed header entry {v!r}") from None
    if not (isinstance(start, int) and isinstance(end, int) and start >= 0 and end - start == want):
        raise ValueError(f"tensor {name}: its data_offsets {[start, end]} do not hold {list(shape)} {dtype}")
    if end > data_bytes:
        raise ValueError(f"truncated: tensor {name} ends at byte {end} of the data, which has {data_bytes}")
    return dtype, shape


_NUMPY = {"F32": np.float32, "F16": np.float16}


def read_tensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as float32 (safetensors' own numpy reader has no bfloat16)."""
    with path.open("rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        data = f.read()
    out = {}
    for name, (dtype, shape) in read_header(path).items():
        start, end = header[name]["data_offsets"]
        raw = data[start:end]
        if dtype == "BF16":  # the high half of a float32
            array = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            array = np.frombuffer(raw, _NUMPY[dtype]).astype(np.float32)
        out[name] = array.reshape(shape)
    return out


def config_problems(config: dict) -> list[str]:
    problems = []
    if config.get("r") != RANK:
        problems.append(f"{CONFIG} has r: {config.get('r')!r}; the build takes rank-{RANK} adapters "
                        f"(train with r={RANK})")
    if config.get("peft_type", "LORA") != "LORA":
        problems.append(f"{CONFIG} has peft_type: {config['peft_type']!r}; the build takes LoRA adapters "
                        "(peft_type LORA)")
    targets = config.get("target_modules") or []
    if not isinstance(targets, str | list):
        targets = []  # then every module is missing, said below
    # a string is PEFT's regular expression (or "all-linear"): the tensors found say what it matched
    missing = [] if isinstance(targets, str) else [m for m in TARGET_MODULES if m not in targets]
    if missing:
        problems.append(f"{CONFIG} target_modules lacks {', '.join(missing)}; the build adapts all of "
                        f"{', '.join(TARGET_MODULES)}")
    if not isinstance(config.get("lora_alpha"), (int, float)) or config["lora_alpha"] <= 0:
        problems.append(f"{CONFIG} has lora_alpha: {config.get('lora_alpha')!r}; expected a positive number")
    problems += [f"{CONFIG} has {key}: {config[key]!r}, which {why}" for key, is_set, why in UNSUPPORTED
                 if is_set(config.get(key))]
    return problems


def tensor_problems(found: dict[str, tuple[str, tuple[int, ...]]], expected: dict[str, tuple[int, int]]) -> list[str]:
    problems = []
    for name, shape in expected.items():
        if name not in found:
            problems.append(f"tensor {name} is missing")
        elif found[name][1] != shape:
            problems.append(f"tensor {name} has shape {list(found[name][1])}; the base needs {list(shape)}")
        elif found[name][0] not in FLOAT_DTYPES:
            problems.append(f"tensor {name} is {found[name][0]}; expected one of {', '.join(FLOAT_DTYPES)}")
    extra = sorted(set(found) - set(expected))
    encoder = [name for name in extra if ENCODER in name]
    if encoder:  # PEFT's target_modules by leaf name also match the audio encoder's q/k/v_proj
        problems.append(f"{len(encoder)} tensors adapt the audio encoder ({encoder[0]}, ...); the build adapts "
                        f'the text decoder only: train with target_modules=r"{DECODER_TARGETS}"')
    problems += [f"tensor {name} adapts nothing in the base" for name in extra if ENCODER not in name]
    if len(problems) > MAX_TENSOR_PROBLEMS:
        problems = problems[:MAX_TENSOR_PROBLEMS] + [f"... and {len(problems) - MAX_TENSOR_PROBLEMS} more tensors"]
    return problems


def adapter_problems(folder: Path, base_config: dict) -> list[str]:
    """Why the adapter in `folder` does not fit the base (config.json `base_config`); empty if it does."""
    missing = [name for name in (CONFIG, WEIGHTS) if not (folder / name).is_file()]
    if missing:
        return [f"{folder} lacks {' and '.join(missing)} (a PEFT-style LoRA folder)"]
    try:
        config = json.loads((folder / CONFIG).read_bytes().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return [f"{folder / CONFIG}: not valid JSON: {exc}"]
    if not isinstance(config, dict):
        return [f"{folder / CONFIG}: expected a JSON object"]
    problems = config_problems(config)
    if problems:  # tensor shapes follow from the rank: a wrong rank would list every tensor
        return problems
    try:
        found = read_header(folder / WEIGHTS)
    except (ValueError, UnicodeDecodeError, KeyError, TypeError) as exc:
        return [f"{folder / WEIGHTS}: {exc}; re-download or re-train the adapter"]
    try:
        expected = expected_tensors(base_config)
    except (KeyError, TypeError) as exc:
        key = "decoder" + ("" if exc.args[0] == "decoder" else f".{exc.args[0]}")
        return [f"the source's config.json lacks {key}; an adapter's shapes follow from the decoder's "
                "dimensions there"]
    return tensor_problems(found, expected)

"""A source export's files checked as a whole, before anything reads them for real: config.json and
tokenizer.json parse and hold what the build reads, embed_tokens.bin has config.json's size, and each
graph has its layout's inputs and outputs (names, element types, ranks, the widths config.json gives).

Every problem is a one-line SourceError naming the user's file, what is wrong and what to do; the build's
source stage, `webbuild fuse`, `webbuild transcribe` and `webbuild bench` on a source folder call
`check_source` first, so that no stage meets a file it would fail on with a traceback (a missing input
deep inside fusion, a reshape of a short table, a JSONDecodeError).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from tokenizers import Tokenizer

from webbuild.errors import SourceError
from webbuild.graph.load import FIX, load_onnx
from webbuild.layouts import Decoder, Layout, Table
from webbuild.site.contract import IO

F32, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
# the config.json keys the build reads: the decoder's dimensions and the end-of-text tokens
DECODER_KEYS = ("num_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size", "vocab_size")
ENCODER = "encoder.onnx"
# name -> (element type, axes) of the split layout's graphs (docs: DESIGN, "Source layouts to accept"). An
# axis is "S" (a length: an input's must be left free, a fixed one refuses other lengths), 1 (batch or one step: 1 or
# free) or a config.json dimension (that size or free): H hidden_size, V vocab_size, L num_layers, KV
# num_key_value_heads, D head_dim, M the encoder's mel bins (128)
_KV = ("L", 1, "KV", "S", "D")
_PRESENTS = {"logits": (F32, (1, "S", "V")), "present_keys": (F32, _KV), "present_values": (F32, _KV)}
SPLIT_IO = {
    "decoder_init.onnx": ({"input_ids": (I64, (1, "S")), "position_ids": (I64, (1, "S")),
                           "audio_features": (F32, (1, "S", "H")), "audio_offset": (I64, (1,))}, _PRESENTS),
    "decoder_step.onnx": ({"input_embeds": (F32, (1, 1, "H")), "position_ids": (I64, (1, 1)), "past_keys": (F32, _KV),
                           "past_values": (F32, _KV)}, _PRESENTS),
}
Axes = tuple[int | str, ...]


def read_json(path: Path, fix: str = FIX) -> dict:
    """A JSON object from a user's file, or a SourceError saying why not and `fix`."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise SourceError(f"{path}: cannot read it ({exc.strerror}); {fix}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise SourceError(f"{path}: not valid JSON ({str(exc).splitlines()[0]}); {fix}") from None
    if not isinstance(data, dict):
        raise SourceError(f"{path}: expected a JSON object, found {type(data).__name__}; {fix}")
    return data


def check_config(path: Path) -> dict:
    """config.json, with the decoder dimensions and special tokens the build reads."""
    cfg = read_json(path)
    dec = cfg.get("decoder")
    for key in DECODER_KEYS:
        value = dec.get(key) if isinstance(dec, dict) else None
        if not (isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**31):
            raise SourceError(f"{path}: decoder.{key} is {value!r}, expected a positive integer; {FIX}")
    special = cfg.get("special_tokens")
    eos = special.get("eos_token_ids") if isinstance(special, dict) else None
    if not (isinstance(eos, list) and eos and all(isinstance(i, int) and not isinstance(i, bool) for i in eos)):
        raise SourceError(f"{path}: special_tokens.eos_token_ids is {eos!r}, expected a list of token ids; {FIX}")
    shape, dims = cfg.get("embed_tokens_shape"), [cfg["decoder"]["vocab_size"], cfg["decoder"]["hidden_size"]]
    if shape is not None and shape != dims:
        raise SourceError(f"{path}: embed_tokens_shape is {shape!r}, but decoder.vocab_size and hidden_size say "
                          f"{dims}; {FIX}")
    dtype = cfg.get("embed_tokens_dtype", "float32")
    if dtype not in ("float32", "float16"):
        raise SourceError(f"{path}: embed_tokens_dtype is {dtype!r}, expected float32 or float16; {FIX}")
    return cfg


def check_tokenizer(path: Path) -> Tokenizer:
    """tokenizer.json as the tokenizers library reads it."""
    read_json(path)
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the library raises a bare Exception for a file it cannot read
        raise SourceError(f"{path}: not a tokenizer ({str(exc).splitlines()[0]}); {FIX}") from None


def check_table(path: Path, cfg: dict) -> None:
    """embed_tokens.bin: vocab_size x hidden_size values of embed_tokens_dtype, no header."""
    dec = cfg["decoder"]
    itemsize = np.dtype(cfg.get("embed_tokens_dtype", "float32")).itemsize
    want = dec["vocab_size"] * dec["hidden_size"] * itemsize
    size = path.stat().st_size if path.is_file() else None
    if size != want:
        raise SourceError(f"{path}: {size} bytes, expected {want} ({dec['vocab_size']} x {dec['hidden_size']} "
                          f"{cfg.get('embed_tokens_dtype', 'float32')} from config.json); {FIX}")


def check_source(folder: Path, layout: Layout) -> dict:
    """Every file of a source folder in `layout` (webbuild.layouts) that the build reads; its config.json."""
    cfg = check_config(folder / "config.json")
    check_tokenizer(folder / "tokenizer.json")
    if layout.table is Table.FLOAT32:
        check_table(folder / "embed_tokens.bin", cfg)
    check_encoder(folder / ENCODER, cfg)
    if layout.decoder is Decoder.SPLIT:
        for name, (inputs, outputs) in SPLIT_IO.items():
            check_graph(folder / name, inputs, outputs, cfg)
    elif layout.decoder is Decoder.MERGED:
        path = folder / layout.prefill
        graph = load_onnx(path).graph
        check_graph(path, *merged_io(cfg["decoder"]["num_layers"], [v.name for v in graph.input]), cfg, graph,
                    extra=True)
    return cfg  # Decoder.SPLIT_EMBEDS: webbuild.reference.source_v2.check_source checks its graphs


def merged_io(layers: int, names: Sequence[str]) -> tuple[dict, dict]:
    """The merged layout's decoder interface (webbuild.site.contract.IO) for `layers` layers; embeddings in,
    or token ids where the graph takes those (`names`: its inputs)."""
    kv = {IO.past(i, k): (F32, (1, "KV", "S", "D")) for i in range(layers) for k in ("key", "value")}
    presents = {IO.present(i, k): (F32, (1, "KV", "S", "D")) for i in range(layers) for k in ("key", "value")}
    first = {IO.input_ids: (I64, (1, "S"))} if IO.input_ids in names else {IO.inputs_embeds: (F32, (1, "S", "H"))}
    return {**first, IO.attention_mask: (I64, (1, "S")), **kv}, {IO.logits: (F32, (1, "S", "V")), **presents}


def check_encoder(path: Path, cfg: dict) -> None:
    """One input, pcm [1, N] or mel [1, 128, F], and audio_features [1, A, H] out."""
    graph = load_onnx(path).graph
    inputs = [v.name for v in graph.input]
    inp = {IO.pcm: (F32, (1, "S"))} if inputs == [IO.pcm] else {IO.mel: (F32, (1, "M", "S"))}
    check_graph(path, inp, {IO.audio_features: (F32, (1, "S", "H"))}, cfg, graph)


def check_graph(path: Path, inputs: Mapping[str, tuple[int, Axes]], outputs: Mapping[str, tuple[int, Axes]],
                cfg: dict, graph: onnx.GraphProto | None = None, extra: bool = False) -> None:
    """The graph at `path` has these inputs and outputs (others too with `extra`): name -> (element type,
    axes; see SPLIT_IO)."""
    graph = graph if graph is not None else load_onnx(path).graph
    d = cfg["decoder"]
    sizes = {"H": d["hidden_size"], "V": d["vocab_size"], "L": d["num_layers"], "KV": d["num_key_value_heads"],
             "D": d["head_dim"], "M": 128}
    for kind, values, want in (("input", graph.input, inputs), ("output", graph.output, outputs)):
        _check_names(path, kind, [v.name for v in values], want, extra)
        for v in values:
            if v.name in want:
                elem, axes = want[v.name]
                _check_value(path, kind, v, elem, tuple(sizes.get(a, a) if isinstance(a, str) else a
                                                        for a in axes))


def _check_names(path: Path, kind: str, found: Sequence[str], want: Mapping[str, object],
                 allow_extra: bool) -> None:
    missing = [n for n in want if n not in found]
    extra = [] if allow_extra else [n for n in found if n not in want]
    if missing or extra or len(set(found)) != len(found):
        what = ", ".join([*([f"no {', '.join(missing)}"] if missing else []),
                          *([f"unexpected {', '.join(extra)}"] if extra else [])]) or "a name twice"
        raise SourceError(f"{path}: {kind}s: {what} (expected {', '.join(_short(want))}); {FIX}")


def _short(names: Mapping[str, object]) -> list[str]:
    """A long per-layer list shortened to its first and last names."""
    keys = list(names)
    return keys if len(keys) <= 8 else [*keys[:4], "...", *keys[-2:]]


def _check_value(path: Path, kind: str, v: onnx.ValueInfoProto, elem: int, axes: Axes) -> None:
    t = v.type.tensor_type
    if not v.type.HasField("tensor_type") or t.elem_type != elem:
        found = onnx.TensorProto.DataType.Name(t.elem_type) if v.type.HasField("tensor_type") else "not a tensor"
        raise SourceError(f"{path}: {kind} {v.name} is {found}, expected "
                          f"{onnx.TensorProto.DataType.Name(elem)}; {FIX}")
    if not t.HasField("shape"):
        return
    dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
    if len(dims) != len(axes):
        raise SourceError(f"{path}: {kind} {v.name} has {len(dims)} axes, expected {len(axes)}; {FIX}")
    for i, (found_dim, want) in enumerate(zip(dims, axes, strict=True)):
        # "S": a length, which an input must leave free; an output's may be fixed (a step's one position)
        if found_dim is not None and found_dim != want and not (want == "S" and kind == "output"):
            expected = "a free length" if want == "S" else f"{want} (config.json)" if want != 1 else "1"
            raise SourceError(f"{path}: {kind} {v.name} axis {i} is fixed at {found_dim}, expected {expected}; "
                              f"{FIX}")

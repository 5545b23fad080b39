"""Rebuild the transformers checkpoint of a zoo split export (the inverse of `webbuild zoo ...`).

    python -m webbuild.train.from_export EXPORT_DIR OUT_DIR

EXPORT_DIR is a split export (webbuild.zoo.export: encoder.onnx, decoder_init.onnx with its
decoder_weights.data, config.json in webbuild's own format, tokenizer.json), such as
examples/tiny-asr/model. OUT_DIR gets what `Qwen3ASRForConditionalGeneration.save_pretrained` writes
plus tokenizer.json: the base that `webbuild.train.adapt` trains adapters on, so an adapter's recipe
starts from the repository alone.

The HF config is the one `webbuild.zoo.presets.make_config` makes, with the dimensions, norms, rope
and special-token ids the export's config.json records. The weights are read from the graphs'
initializers, as the torchscript exporter left them:
- encoder.onnx: `tower.*` and `projector.*` under their module names; the one linear whose weight was
  folded into a transposed anonymous initializer (`onnx::MatMul_602`: `/conv_out/MatMul`) is found
  by the scope of the MatMul node that reads it.
- decoder_init.onnx: `embed.weight`, `layers.N.*` norms and `norm.weight` by name; the projections are
  anonymous transposed MatMul initializers, in graph order q, k, v, o, gate, up, down per layer, then
  lm_head (the embedding's transpose when tie_word_embeddings).

The graphs are read by a small protobuf reader here, not the `onnx` package, so that the GPU machine
(python3 with torch, nothing else) can rebuild the base; tests check it against `onnx`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import click
import numpy as np

from webbuild import layouts
from webbuild.errors import SourceError

ENCODER_PREFIXES = {"tower.": "model.audio_tower.", "projector.": "model.multi_modal_projector."}
DECODER_PREFIX = "model.language_model."
DECODER_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# ----------------------------------------------------------------------------- a minimal ONNX reader

# TensorProto.DataType -> numpy dtype, for the types weights come in
_DTYPES = {1: np.float32, 10: np.float16, 11: np.float64, 6: np.int32, 7: np.int64, 16: None}


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def _fields(buf: memoryview):
    """(field number, wire type, value) of one protobuf message: an int for varints, a memoryview for
    length-delimited fields, bytes for fixed-width ones."""
    pos, end = 0, len(buf)
    value: int | memoryview | bytes
    while pos < end:
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + size], pos + size
        elif wire == 1:
            value, pos = bytes(buf[pos : pos + 8]), pos + 8
        elif wire == 5:
            value, pos = bytes(buf[pos : pos + 4]), pos + 4
        else:
            raise ValueError(f"protobuf wire type {wire} is not read here")
        yield field, wire, value


@dataclass
class Node:
    op_type: str
    name: str
    inputs: list[str]


@dataclass
class Graph:
    nodes: list[Node]
    initializers: dict[str, np.ndarray]


def _tensor(buf: memoryview, folder: Path) -> tuple[str, np.ndarray]:
    """A TensorProto's name and array (inline raw_data or float_data, or external data in `folder`)."""
    name, dims, dtype, raw, floats, external, location = "", [], 1, None, [], {}, 0
    for field, wire, value in _fields(buf):
        if field == 1:  # dims, packed or not
            if wire == 2:
                pos = 0
                while pos < len(value):
                    d, pos = _varint(value, pos)
                    dims.append(d)
            else:
                dims.append(value)
        elif field == 2:
            dtype = value
        elif field == 4:  # float_data
            floats.append(np.frombuffer(bytes(value), "<f4") if wire == 2 else np.frombuffer(value, "<f4"))
        elif field == 8:
            name = bytes(value).decode()
        elif field == 9:
            raw = bytes(value)
        elif field == 13:  # external_data: StringStringEntryProto key=1, value=2
            entry = {f: bytes(v).decode() for f, _, v in _fields(value)}
            external[entry[1]] = entry[2]
        elif field == 14:
            location = value
    np_dtype = _DTYPES.get(dtype)
    if np_dtype is None:
        raise SourceError(f"initializer {name!r}: ONNX data type {dtype} is not read here")
    count = int(np.prod(dims)) if dims else 1
    if location == 1:  # EXTERNAL
        with open(folder / external["location"], "rb") as f:
            f.seek(int(external.get("offset", 0)))
            raw = f.read(int(external.get("length", count * np.dtype(np_dtype).itemsize)))
    if raw is not None:
        array = np.frombuffer(raw, np.dtype(np_dtype).newbyteorder("<"), count)
    elif floats and np_dtype is np.float32:
        array = np.concatenate(floats)
    else:
        raise SourceError(f"initializer {name!r}: no data in a form read here")
    return name, array.astype(np_dtype).reshape(dims)


def _node(buf: memoryview) -> Node:
    inputs, name, op = [], "", ""
    for field, _, value in _fields(buf):
        if field == 1:
            inputs.append(bytes(value).decode())
        elif field == 3:
            name = bytes(value).decode()
        elif field == 4:
            op = bytes(value).decode()
    return Node(op, name, inputs)


def read_graph(path: Path) -> Graph:
    """The top-level nodes (in graph order) and initializers of an ONNX file; external data is read
    from the file's folder."""
    data = memoryview(Path(path).read_bytes())
    graph = next((v for f, w, v in _fields(data) if f == 7 and w == 2), None)
    if graph is None:
        raise SourceError(f"{path}: no graph in this file; is it an ONNX model?")
    nodes, inits = [], {}
    for field, _, value in _fields(graph):
        if field == 1:
            nodes.append(_node(value))
        elif field == 5:
            name, array = _tensor(value, Path(path).parent)
            inits[name] = array
    return Graph(nodes, inits)


# ----------------------------------------------------------------------------- export -> checkpoint


def hf_config(split: dict):
    """The `Qwen3ASRConfig` of a split export's config.json (webbuild.zoo.export.split_config)."""
    from webbuild.zoo.presets import Preset, make_config

    enc, dec, special = split["encoder"], split["decoder"], split["special_tokens"]
    preset = Preset(
        name="export",
        audio=dict(d_model=enc["hidden_size"], encoder_layers=enc["num_layers"],
                   encoder_attention_heads=enc["num_heads"], encoder_ffn_dim=enc["ffn_dim"],
                   downsample_hidden_size=enc["conv_channels"]),
        text=dict(hidden_size=dec["hidden_size"], intermediate_size=dec["intermediate_size"],
                  num_hidden_layers=dec["num_layers"], num_attention_heads=dec["num_attention_heads"],
                  num_key_value_heads=dec["num_key_value_heads"], head_dim=dec["head_dim"],
                  max_position_embeddings=dec["max_position_embeddings"]),
        bpe_vocab_size=0, qwen_ids=False,
    )
    ids = {"<|endoftext|>": special["pad_token_id"], "<|im_end|>": special["im_end_token_id"],
           "<|audio_pad|>": special["audio_pad_token_id"]}
    config = make_config(preset, dec["vocab_size"], ids)
    # what make_config fixes and an export records: take the export's
    text = config.text_config
    text.rms_norm_eps = dec["rms_norm_eps"]
    text.rope_parameters["rope_theta"] = dec["rope_theta"]
    config.audio_config.num_mel_bins = enc["num_mel_bins"]
    config.tie_word_embeddings = text.tie_word_embeddings = bool(dec["tie_word_embeddings"])
    if enc["output_dim"] != dec["hidden_size"]:
        raise SourceError(f"encoder output_dim {enc['output_dim']} != decoder hidden_size {dec['hidden_size']}")
    return config


def _matmul_weights(graph: Graph) -> list[tuple[Node, np.ndarray]]:
    """MatMul nodes whose weight is an initializer, in graph order, with that weight as nn.Linear
    holds it ([out, in]: the exporter stored its transpose)."""
    return [(n, graph.initializers[n.inputs[1]].T) for n in graph.nodes
            if n.op_type == "MatMul" and len(n.inputs) == 2 and n.inputs[1] in graph.initializers]


def _scope(node: Node) -> str:
    """`/mlp/gate_proj_2/MatMul` -> `gate_proj` (the torchscript scope of the module, its call count
    stripped)."""
    parts = node.name.strip("/").split("/")
    leaf = parts[-2] if len(parts) >= 2 else ""
    base, _, count = leaf.rpartition("_")
    return base if count.isdigit() and base else leaf


def encoder_weights(graph: Graph, expected: set[str]) -> dict[str, np.ndarray]:
    """HF names -> arrays of encoder.onnx's weights."""
    out = {}
    for name, array in graph.initializers.items():
        for prefix, hf in ENCODER_PREFIXES.items():
            if name.startswith(prefix):
                out[hf + name[len(prefix):]] = array
    for node, weight in _matmul_weights(graph):
        if not node.inputs[1].startswith("onnx::"):
            continue  # a named weight, taken above
        leaf = _scope(node)
        hits = [k for k in expected - out.keys()
                if k.startswith("model.audio_tower.") and k.endswith(f".{leaf}.weight")]
        if len(hits) != 1:
            raise SourceError(f"encoder.onnx: MatMul {node.name!r} reads anonymous weight {node.inputs[1]}, "
                              f"which matches {len(hits)} encoder weights (want one)")
        out[hits[0]] = weight
    return out


def decoder_weights(graph: Graph, layers: int, tied: bool) -> dict[str, np.ndarray]:
    """HF names -> arrays of decoder_init.onnx's weights."""
    out = {}
    for name, array in graph.initializers.items():
        if name == "embed.weight":
            out[DECODER_PREFIX + "embed_tokens.weight"] = array
        elif name.startswith("layers.") or name == "norm.weight":
            out[DECODER_PREFIX + name] = array
    mats = _matmul_weights(graph)
    want = [f"layers.{i}.{'mlp' if p in ('gate_proj', 'up_proj', 'down_proj') else 'self_attn'}.{p}"
            for i in range(layers) for p in DECODER_PROJECTIONS] + ["lm_head"]
    if len(mats) != len(want):
        raise SourceError(f"decoder_init.onnx: {len(mats)} MatMul weights, want {len(want)} "
                          f"({len(DECODER_PROJECTIONS)} per layer of {layers}, then lm_head)")
    for (node, weight), name in zip(mats, want):
        leaf = name.rsplit(".", 1)[-1]
        if node.name and _scope(node) != leaf:
            raise SourceError(f"decoder_init.onnx: MatMul {node.name!r} is where {name} should be")
        if name == "lm_head":
            embed = out.get(DECODER_PREFIX + "embed_tokens.weight")
            if tied and (embed is None or not np.array_equal(weight, embed)):
                raise SourceError("decoder_init.onnx: lm_head differs from the embedding but the config ties them")
            if not tied:
                out["lm_head.weight"] = weight
        else:
            out[f"{DECODER_PREFIX}{name}.weight"] = weight
    return out


def load_export(export_dir: Path):
    """(Qwen3ASRForConditionalGeneration in fp32, eval mode; tokenizer) of a split export."""
    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen3ASRForConditionalGeneration

    from webbuild.reference.tokenizer import special_ids

    export_dir = Path(export_dir)
    for name in ("config.json", "encoder.onnx", "decoder_init.onnx", "tokenizer.json"):
        if not (export_dir / name).is_file():
            raise SourceError(f"{export_dir / name}: missing; a split export (webbuild zoo --layout "
                              f"{layouts.SPLIT.name}) has it")
    split = json.loads((export_dir / "config.json").read_text())
    tok = Tokenizer.from_file(str(export_dir / "tokenizer.json"))
    ids = special_ids(tok)
    special = split["special_tokens"]
    for key, token in (("pad_token_id", "<|endoftext|>"), ("im_end_token_id", "<|im_end|>"),
                       ("audio_pad_token_id", "<|audio_pad|>")):
        if special[key] != ids[token]:
            raise SourceError(f"{export_dir}: config.json {key} {special[key]} != tokenizer's {token} {ids[token]}")
    config = hf_config(split)
    model = Qwen3ASRForConditionalGeneration(config).float()
    persistent = set(model.state_dict().keys())
    if config.tie_word_embeddings:
        persistent.discard("lm_head.weight")
    weights = encoder_weights(read_graph(export_dir / "encoder.onnx"), persistent)
    weights.update(decoder_weights(read_graph(export_dir / "decoder_init.onnx"),
                                   config.text_config.num_hidden_layers, config.tie_word_embeddings))
    missing, unknown = persistent - weights.keys(), weights.keys() - persistent
    if missing or unknown:
        raise SourceError(f"{export_dir}: the graphs lack {sorted(missing)[:4]} and hold unknown {sorted(unknown)[:4]}")
    state = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in weights.items()}
    model.load_state_dict(state, strict=False)  # strict would want the tied lm_head.weight too
    if config.tie_word_embeddings:
        model.tie_weights()
    return model.eval(), tok


def rebuild(export_dir: Path, out_dir: Path) -> Path:
    """Write the checkpoint folder of `export_dir` (save_pretrained + tokenizer.json) to `out_dir`."""
    from transformers.utils import logging as hf_logging

    model, tok = load_export(export_dir)
    hf_logging.disable_progress_bar()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tok.save(str(out_dir / "tokenizer.json"))
    return out_dir


def is_export(folder: Path) -> bool:
    return (Path(folder) / "decoder_init.onnx").is_file()


@click.command()
@click.argument("export_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out_dir", type=click.Path(path_type=Path))
def main(export_dir: Path, out_dir: Path):
    """Rebuild the transformers checkpoint of split export EXPORT_DIR into OUT_DIR."""
    rebuild(export_dir, out_dir)
    click.echo(f"wrote {out_dir}")


if __name__ == "__main__":
    main()

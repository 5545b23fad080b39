"""Layout v2 of a Qwen3-ASR export (model.yaml `source.layout: qwen3-asr-v2`): its files, the interface
of its graphs, and its int8 embedding table.

The layout is the one a browser ASR app publishes for onnxruntime-web (its `q4` variant): no embedding
table inside any graph, both decoders in one weights file, an int8 table looked up by the caller.
Names, dtypes and shapes followed here (L layers, kv key/value heads, hd head dim, H hidden, V vocab):

- `encoder.onnx`: `mel` float32 [1, 128, T] -> `audio_features` float32 [1, A, H].
- `decoder_init.int4.onnx` (prefill): `input_embeds` float32 [1, S, H] (the prompt's table rows with
  the A audio rows written over its `<|audio_pad|>` block), `position_ids` int64 [1, S] (0..S-1)
  -> `logits` float32 [1, 1, V] (last position only), `present_keys`, `present_values` float32
  [L, 1, kv, S, hd] (all layers stacked on axis 0).
- `decoder_step.int4.onnx` (one token): `input_embeds` float32 [1, 1, H], `position_ids` int64 [1, 1],
  `past_keys`, `past_values` float32 [L, 1, kv, P, hd] -> `logits` float32 [1, 1, V],
  `present_keys`, `present_values` float32 [L, 1, kv, P + 1, hd].
- `decoder_weights.int4.data`: the external data of both decoders (one copy of each tensor); their
  MatMul weights, lm_head included, are com.microsoft.MatMulNBits, 4-bit, symmetric, block 32.
- `embed_tokens.int8.bin`: int8 [V, H] row-major; `embed_scales.f32.bin`: float32 [V], one per row;
  a row's embedding is `q[id] * scale[id]` (symmetric per row, codes in -127..127).
- `config.json` (the `decoder` block gives L, kv, hd, H, V), `tokenizer.json`; `prompt_config.json`
  (prompt ids, the table's description) is written by the zoo and not read by the build.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from onnx import TensorProto

from webbuild.errors import SourceError
from webbuild.graph.load import load_onnx
from webbuild.layouts import V2

INIT, STEP = V2.graphs  # decoder_init.int4.onnx, decoder_step.int4.onnx
WEIGHTS = "decoder_weights.int4.data"
TABLE = "embed_tokens.int8.bin"
SCALES = "embed_scales.f32.bin"
BLOCK_SIZE = 32

_FLOAT, _INT64 = TensorProto.FLOAT, TensorProto.INT64
INIT_IO = ({"input_embeds": _FLOAT, "position_ids": _INT64},
           {"logits": _FLOAT, "present_keys": _FLOAT, "present_values": _FLOAT})
STEP_IO = ({"input_embeds": _FLOAT, "position_ids": _INT64, "past_keys": _FLOAT, "past_values": _FLOAT},
           INIT_IO[1])
FIX = "re-export the model in layout v2 (`python -m webbuild.zoo.export_v2 SPLIT_DIR OUT_DIR`)"


def quantize_table(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float [V, H] -> (int8 codes [V, H], float32 scales [V]): symmetric per row; an all-zero row
    gets scale 1 so that dequantizing never divides by zero."""
    scales = (np.abs(table).max(axis=1) / 127.0).astype(np.float32)
    scales[scales == 0] = 1.0
    codes = np.clip(np.rint(table / scales[:, None]), -127, 127).astype(np.int8)
    return codes, scales


def embed_table(model_dir: Path, cfg: dict) -> np.ndarray:
    """The float32 [V, H] table of a v2 folder (`cfg`: its config.json), its file sizes checked."""
    vocab, hidden = _dims(cfg, model_dir)
    codes = np.fromfile(_sized(model_dir / TABLE, vocab * hidden, f"{vocab} x {hidden} int8"), np.int8)
    scales = np.fromfile(_sized(model_dir / SCALES, 4 * vocab, f"{vocab} float32"), np.float32)
    return codes.reshape(vocab, hidden).astype(np.float32) * scales[:, None]


def check_source(model_dir: Path, cfg: dict) -> None:
    """A v2 folder's decoders have the names and dtypes above and take H-wide embeddings, and its table
    files have config.json's size: else a SourceError naming the file, what is wrong and the fix."""
    vocab, hidden = _dims(cfg, model_dir)
    _sized(model_dir / TABLE, vocab * hidden, f"{vocab} x {hidden} int8")
    _sized(model_dir / SCALES, 4 * vocab, f"{vocab} float32")
    for name, (inputs, outputs) in ((INIT, INIT_IO), (STEP, STEP_IO)):
        graph = load_onnx(model_dir / name).graph
        _check_io(model_dir / name, "input", graph.input, inputs)
        _check_io(model_dir / name, "output", graph.output, outputs)
        width = graph.input[0].type.tensor_type.shape.dim[-1]
        if width.HasField("dim_value") and width.dim_value != hidden:
            raise SourceError(f"{model_dir / name}: input_embeds is {width.dim_value} wide, but config.json "
                              f"decoder.hidden_size is {hidden}; {FIX}")


def _dims(cfg: dict, model_dir: Path) -> tuple[int, int]:
    dec = cfg.get("decoder", {})
    missing = [k for k in ("vocab_size", "hidden_size") if not isinstance(dec.get(k), int)]
    if missing:
        raise SourceError(f"{model_dir / 'config.json'}: decoder.{missing[0]} is missing; the int8 table's "
                          f"shape is read from it; {FIX}")
    return dec["vocab_size"], dec["hidden_size"]


def _sized(path: Path, size: int, what: str) -> Path:
    if path.stat().st_size != size:
        raise SourceError(f"{path}: {path.stat().st_size} bytes, expected {size} ({what}, from config.json "
                          f"decoder.vocab_size and hidden_size); {FIX}")
    return path


def _check_io(path: Path, kind: str, values, expected: Mapping[str, int]) -> None:
    found = {v.name: v.type.tensor_type.elem_type for v in values}
    if list(found) != list(expected):
        raise SourceError(f"{path}: {kind}s {list(found)}, expected {list(expected)} (layout v2); {FIX}")
    for name, dtype in expected.items():
        if found[name] != dtype:
            want = "int64" if dtype == _INT64 else "float32"
            raise SourceError(f"{path}: {kind} {name} is not {want} (layout v2 q4 graphs); {FIX}")

"""A zoo split export rewritten in layout v2 (webbuild.reference.source_v2 gives its files and interface).

    python -m webbuild.zoo.export_v2 SPLIT_DIR OUT_DIR

From our own graphs: decoder_step already has v2's interface; decoder_init loses its embedding lookup
and audio splice (the residual stream they make becomes the `input_embeds` input, as a v2 caller
builds it from the table) and computes logits for the last position only (fusion's prune_lm_head).
Both are then quantized by onnxruntime's MatMulNBits quantizer (4-bit, symmetric, block 32, accuracy
level 4, as the published q4 graphs) and saved with one shared weights file; the float table becomes
the int8 table and its scales. The encoder, tokenizer.json and preprocessor_config.json are copied.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from tokenizers import Tokenizer

from webbuild.errors import ZooError
from webbuild.fusion import prune_lm_head
from webbuild.fusion.rule_report import Report
from webbuild.graph.ir import attr, dead_code_elimination, only_user
from webbuild.graph.load import load_onnx
from webbuild.reference import source_v2 as v2
from webbuild.reference.prompt import PROMPT_PREFIX, PROMPT_SUFFIX
from webbuild.zoo.export import check_new_folder
from webbuild.zoo.onnx_export import save_sharing_weights
from webbuild.zoo.published_int4 import quantize_graph

SPLICE_INPUTS = ("input_ids", "audio_features", "audio_offset")
COPIED = ("encoder.onnx", "tokenizer.json", "preprocessor_config.json")


def convert(split_dir: Path, out: Path, accuracy_level: int = 4) -> Path:
    """Write the v2 export of the split export `split_dir` into `out` (new; nothing left on failure)."""
    split_dir, out = Path(split_dir), Path(out)
    check_new_folder(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((split_dir / "config.json").read_text())
    with tempfile.TemporaryDirectory(prefix=".zoo-", dir=out.parent) as tmp:
        stage = Path(tmp) / "out"
        stage.mkdir()
        init = ir.serde.serialize_model(embeds_init(_load(split_dir / "decoder_init.onnx")))
        graphs = {stage / v2.INIT: init, stage / v2.STEP: _load_proto(split_dir / "decoder_step.onnx")}
        for path, model in graphs.items():
            graphs[path] = quantize_graph(model, v2.BLOCK_SIZE, accuracy_level)
        save_sharing_weights(graphs, stage / v2.WEIGHTS)
        _write_table(split_dir, cfg, stage)
        for name in COPIED:
            shutil.copy(split_dir / name, stage / name)
        _write_configs(split_dir, cfg, stage)
        stage.rename(out)
    return out


def embeds_init(model: ir.Model) -> ir.Model:
    """The split prefill graph taking `input_embeds` [B, S, H] where it took input_ids, audio_features
    and audio_offset, with last-position logits; rewritten in place."""
    g = model.graph
    inputs = {v.name: v for v in g.inputs if v.name is not None}
    lookup, splice = _splice(inputs)
    table = lookup.inputs[0]
    if table is None or table.shape is None:
        raise ZooError("decoder_init: the embedding Gather's table has no shape; not a zoo split export")
    x0, hidden = splice.outputs[0], table.shape[-1]  # the table's [V, H]
    embeds = ir.Value(name="input_embeds", type=inputs["audio_features"].type,  # the float type of the stream
                      shape=ir.Shape(["batch", "seq_len", hidden]))
    ir.convenience.replace_all_uses_with(x0, embeds)
    _read_shapes_from(embeds, inputs)
    dead_code_elimination(model)
    left = [n for n in SPLICE_INPUTS if list(inputs[n].consumers())]
    if left:
        raise ZooError(f"decoder_init: {left[0]} is used beyond the embedding splice; not a zoo split export")
    g.inputs.clear()
    g.inputs.extend([embeds, inputs["position_ids"]])
    if not prune_lm_head.rule().apply(model, Report()):
        raise ZooError("decoder_init: logits are not one lm_head MatMul over [B, S, H]; not a zoo split export")
    dead_code_elimination(model)
    return model


def _read_shapes_from(embeds: ir.Value, inputs: dict[str, ir.Value]) -> None:
    """Shape reads of the batch and sequence axes, [B, S] of input_ids (torchscript, dynamo) or [B] of
    audio_features (dynamo), read the same axes of input_embeds instead."""
    for name, rank, axes in (("input_ids", 2, 2), ("audio_features", 3, 1)):
        for user in list(inputs[name].consumers()):
            start, end = attr(user, "start", 0), attr(user, "end", rank)
            if user.op_type == "Shape" and start >= 0 and end <= axes:
                user.replace_input_with(0, embeds)
                user.attributes["end"] = ir.AttrInt64("end", end)


def _splice(inputs: dict[str, ir.Value]) -> tuple[ir.Node, ir.Node]:
    """The embedding Gather and the Where that puts audio rows over its rows
    (webbuild.zoo.wrappers.SplitDecoderInit)."""
    if not set(SPLICE_INPUTS) | {"position_ids"} <= set(inputs):
        raise ZooError(f"decoder_init: inputs {sorted(inputs)}, expected {', '.join(SPLICE_INPUTS)}, position_ids")
    lookup = next((n for n in inputs["input_ids"].consumers() if n.op_type == "Gather"), None)
    splice = only_user(lookup.outputs[0], "Where") if lookup is not None else None
    if lookup is None or splice is None:
        raise ZooError("decoder_init: no embedding Gather on input_ids feeding one Where (the audio splice)")
    return lookup, splice


def _load(path: Path) -> ir.Model:
    return ir.serde.deserialize_model(_load_proto(path))


def _load_proto(path: Path) -> onnx.ModelProto:
    return load_onnx(path, external_data=True)


def _write_table(split_dir: Path, cfg: dict, stage: Path) -> None:
    dec = cfg["decoder"]
    table = np.fromfile(split_dir / "embed_tokens.bin", np.float32).reshape(dec["vocab_size"], dec["hidden_size"])
    codes, scales = v2.quantize_table(table)
    codes.tofile(stage / v2.TABLE)
    scales.tofile(stage / v2.SCALES)


def _write_configs(split_dir: Path, cfg: dict, stage: Path) -> None:
    """config.json without the float table's fields (v2 has no embed_tokens.bin); prompt_config.json
    describing the prompt, the int8 table and the q4 variant's files, as the layout's clients read it."""
    cfg = {k: v for k, v in cfg.items() if not k.startswith("embed_tokens_")}
    (stage / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    tok = Tokenizer.from_file(str(split_dir / "tokenizer.json"))
    dec, special = cfg["decoder"], cfg["special_tokens"]
    ids = lambda text: tok.encode(text, add_special_tokens=False).ids  # noqa: E731
    prompt_config = {
        "layout_version": 2,
        "prompt": {"prefix_ids": ids(PROMPT_PREFIX), "suffix_ids": ids(PROMPT_SUFFIX),
                   "audio_pad_id": special["audio_pad_token_id"], "asr_text_id": special["asr_text_token_id"],
                   "eos_ids": special["eos_token_ids"]},
        "embedding": {"file": v2.TABLE, "dtype": "int8", "shape": [dec["vocab_size"], dec["hidden_size"]],
                      "scales_file": v2.SCALES},
        "decoder": {k: dec[k] for k in ("num_layers", "num_key_value_heads", "head_dim", "hidden_size",
                                        "vocab_size")},
        "variants": {"q4": {"encoder": "encoder.onnx", "decoder_init": v2.INIT, "decoder_step": v2.STEP,
                            "weights": v2.WEIGHTS, "required_features": []}},
    }
    (stage / "prompt_config.json").write_text(json.dumps(prompt_config, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("split_dir", type=Path)
    ap.add_argument("out", type=Path)
    a = ap.parse_args()
    print(convert(a.split_dir, a.out))


if __name__ == "__main__":
    main()

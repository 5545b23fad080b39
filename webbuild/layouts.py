"""The source layouts: the sets of files a Qwen3-ASR export is published as, one entry each.

An entry gives the layout's name (model.yaml `source.layout`, `webbuild zoo --layout`), the old spellings
still accepted, the files a folder of it holds, its decoder graphs, and how its decoder and its
embedding table are read. Config, the build's stages, fusion, the reference and the zoo look a layout up
here (`layout`, or `detect` for a folder) and act on the entry's fields, never on its name. The module
sits at the bottom of the import layers: it imports nothing from webbuild.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

log = logging.getLogger(__name__)

SIDE_FILES = ("embed_tokens.bin", "config.json", "tokenizer.json")


class Decoder(Enum):
    """How a layout's decoder graphs are called; webbuild.reference.transcribe runs each with its own
    class, webbuild.zoo.export writes and checks SPLIT and MERGED."""

    # decoder_init: input_ids, position_ids, audio_features, audio_offset (the audio spliced inside);
    # decoder_step: input_embeds, position_ids, past_keys, past_values (all layers stacked)
    SPLIT = "split"
    # decoder_init: input_embeds (the caller splices the audio rows in), position_ids; decoder_step as SPLIT's
    SPLIT_EMBEDS = "split, prefill on embeddings"
    # one graph for prefill and step: inputs_embeds, attention_mask, past_key_values.{i}.key|value
    MERGED = "merged"


class Table(Enum):
    """The form of a layout's embedding table."""

    FLOAT32 = "embed_tokens.bin, float32 [V, H]"
    # embed_tokens.int8.bin (int8 [V, H]) with embed_scales.f32.bin (one float32 scale per row):
    # webbuild.reference.source_v2 reads it and checks it and the graphs that take its rows
    INT8_ROWS = "embed_tokens.int8.bin + embed_scales.f32.bin"


@dataclass(frozen=True)
class Layout:
    name: str  # model.yaml source.layout, webbuild zoo --layout
    aliases: tuple[str, ...]  # old spellings: accepted, with a deprecation line
    files: tuple[str, ...]  # what a folder of this layout holds (model.yaml's loader lists the missing ones)
    # the decoder graphs: prefill first (the one the fuse stage reads; its presence tells a folder's
    # layout apart), then step; or one graph serving both
    graphs: tuple[str, ...]
    decoder: Decoder
    table: Table
    # the prefill graph has the build's decoder interface already: fusion.enabled false skips the fuse
    # stage and the assemble stage takes the graph as it is; otherwise the fuse stage must make it
    fusion_optional: bool
    zoo: bool  # `webbuild zoo --layout` writes it (webbuild.zoo.export)
    summary: str  # what sets it apart, for help texts and docs/model-yaml.md

    @property
    def prefill(self) -> str:
        """The decoder graph the fuse stage reads, a file name in the source folder."""
        return self.graphs[0]


SPLIT = Layout(
    name="qwen3-asr-split", aliases=("split",),
    files=("encoder.onnx", "decoder_init.onnx", "decoder_step.onnx", *SIDE_FILES),
    graphs=("decoder_init.onnx", "decoder_step.onnx"), decoder=Decoder.SPLIT, table=Table.FLOAT32,
    fusion_optional=False, zoo=True,
    summary="decoder_init takes input_ids and splices the audio features in, decoder_step takes one "
            "token's embedding (the layout people publish)")
MERGED = Layout(
    name="merged", aliases=(),
    files=("encoder.onnx", "decoder_model_merged.onnx", *SIDE_FILES),
    graphs=("decoder_model_merged.onnx",), decoder=Decoder.MERGED, table=Table.FLOAT32,
    fusion_optional=True, zoo=True,
    summary="one decoder taking inputs_embeds, attention_mask and past_key_values (optimum style)")
V2 = Layout(
    name="qwen3-asr-v2", aliases=(),
    files=("encoder.onnx", "decoder_init.int4.onnx", "decoder_step.int4.onnx", "decoder_weights.int4.data",
           "embed_tokens.int8.bin", "embed_scales.f32.bin", "config.json", "tokenizer.json"),
    graphs=("decoder_init.int4.onnx", "decoder_step.int4.onnx"), decoder=Decoder.SPLIT_EMBEDS,
    table=Table.INT8_ROWS, fusion_optional=False, zoo=False,
    summary="the layout published for browsers, decoder_init taking input_embeds and position_ids, both "
            "decoders int4 MatMulNBits sharing one weights file, the table int8 with a float32 scale per row "
            "(`python -m webbuild.zoo.export_v2` converts a split export)")
LAYOUTS = (SPLIT, MERGED, V2)
NAMES = tuple(entry.name for entry in LAYOUTS)
ZOO_LAYOUTS = tuple(entry for entry in LAYOUTS if entry.zoo)


def names_text() -> str:
    """The canonical names as an error message lists them."""
    return ", ".join(repr(name) for name in NAMES)


def describe() -> str:
    """Every layout with its files and what sets it apart, as docs/model-yaml.md lists them."""
    return "; ".join(f"{entry.name} ({', '.join(entry.files)}): {entry.summary}" for entry in LAYOUTS)


def aliases_text() -> str:
    """Each old spelling with the name it stands for, as docs list them."""
    return ", ".join(f"{alias} ({entry.name})" for entry in LAYOUTS for alias in entry.aliases)


def find(name: str, setting: str = "source.layout") -> Layout | None:
    """The layout called `name`, or None. An old spelling logs one deprecation line naming `setting`
    (where the name was given: `source.layout`, `--layout`)."""
    for entry in LAYOUTS:
        if name == entry.name:
            return entry
        if name in entry.aliases:
            log.warning(f"{setting} {name!r} is deprecated: use {entry.name!r}")
            return entry
    return None


def layout(name: str, setting: str = "source.layout") -> Layout:
    """`find`, with a ValueError naming `setting` and the valid names for an unknown name (model.yaml's
    loader and `webbuild zoo --layout` check the name first and report it as bad input)."""
    entry = find(name, setting)
    if entry is None:
        raise ValueError(f"{setting}: unknown layout {name!r}; expected one of {names_text()}")
    return entry


def detect(folder: Path) -> Layout | None:
    """The layout of a source folder, told by its prefill graph (the first layout's, in LAYOUTS' order,
    that the folder holds); None when it holds none."""
    return next((entry for entry in LAYOUTS if (Path(folder) / entry.prefill).is_file()), None)


def detect_hint() -> str:
    """What `detect` looks for, as an error message lists it."""
    return ", ".join(f"{entry.prefill} ({entry.name})" for entry in LAYOUTS)

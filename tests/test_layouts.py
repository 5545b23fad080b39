"""The layout registry (webbuild.layouts): each layout's files and names, old spellings accepted with one
deprecation line, unknown names refused in one line, folders recognised by their files. No torch."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

from webbuild import layouts
from webbuild.cli import main
from webbuild.config import load_config
from webbuild.layouts import LAYOUTS, Decoder, Table

EXPECTED_FILES = {
    "qwen3-asr-split": {"encoder.onnx", "decoder_init.onnx", "decoder_step.onnx", "embed_tokens.bin", "config.json",
                        "tokenizer.json"},
    "merged": {"encoder.onnx", "decoder_model_merged.onnx", "embed_tokens.bin", "config.json", "tokenizer.json"},
    "qwen3-asr-v2": {"encoder.onnx", "decoder_init.int4.onnx", "decoder_step.int4.onnx", "decoder_weights.int4.data",
                     "embed_tokens.int8.bin", "embed_scales.f32.bin", "config.json", "tokenizer.json"},
}
DEPRECATED = "source.layout 'split' is deprecated: use 'qwen3-asr-split'"


def _folder(root: Path, files) -> Path:
    """A folder of empty files with these names."""
    root.mkdir()
    for name in files:
        (root / name).touch()
    return root


def test_each_layout_has_its_files_and_graphs():
    assert {entry.name: set(entry.files) for entry in LAYOUTS} == EXPECTED_FILES
    for entry in LAYOUTS:
        assert set(entry.graphs) <= set(entry.files) and entry.prefill == entry.graphs[0]
        assert len(entry.graphs) == (1 if entry.decoder is Decoder.MERGED else 2), entry.name
    assert [e.name for e in LAYOUTS if e.fusion_optional] == ["merged"]  # its decoder has the build's interface
    assert [e.name for e in layouts.ZOO_LAYOUTS] == ["qwen3-asr-split", "merged"]
    assert [e.name for e in LAYOUTS if e.table is Table.INT8_ROWS] == ["qwen3-asr-v2"]


def test_names_and_old_spellings_are_unique():
    spellings = [name for entry in LAYOUTS for name in (entry.name, *entry.aliases)]
    assert len(spellings) == len(set(spellings))
    assert layouts.SPLIT.aliases == ("split",)


def test_a_canonical_name_is_found_silently(caplog):
    with caplog.at_level(logging.WARNING):
        assert [layouts.layout(name) for name in layouts.NAMES] == list(LAYOUTS)
    assert caplog.records == []


def test_an_old_spelling_works_with_one_deprecation_line(caplog):
    with caplog.at_level(logging.WARNING):
        assert layouts.layout("split") is layouts.SPLIT
    assert [r.getMessage() for r in caplog.records] == [DEPRECATED]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        layouts.layout("split", "--layout")
    assert [r.getMessage() for r in caplog.records] == ["--layout 'split' is deprecated: use 'qwen3-asr-split'"]


def test_an_unknown_name_is_one_line_naming_the_setting_and_the_names():
    with pytest.raises(ValueError) as exc:
        layouts.layout("qwen3-asr-merged", "--layout")
    assert str(exc.value) == ("--layout: unknown layout 'qwen3-asr-merged'; expected one of 'qwen3-asr-split', "
                              "'merged', 'qwen3-asr-v2'")


@pytest.mark.parametrize("entry", LAYOUTS, ids=lambda e: e.name)
def test_detect_tells_a_folder_by_its_files(tmp_path, entry):
    assert layouts.detect(_folder(tmp_path / "export", entry.files)) is entry


def test_detect_finds_nothing_in_a_folder_of_other_files(tmp_path):
    assert layouts.detect(_folder(tmp_path / "site", ["encoder.onnx", "decoder.onnx", "config.json"])) is None
    assert "decoder_init.int4.onnx (qwen3-asr-v2)" in layouts.detect_hint()


def test_the_v2_module_reads_files_the_registry_lists():
    from webbuild.reference import source_v2

    assert {source_v2.WEIGHTS, source_v2.TABLE, source_v2.SCALES} <= set(layouts.V2.files)


def test_the_reference_runs_every_decoder_and_table():
    from webbuild.reference.transcribe import DECODERS, TABLES

    assert set(DECODERS) == set(Decoder) and set(TABLES) == set(Table)


def _model_yaml(tmp_path: Path, layout: str) -> Path:
    _folder(tmp_path / "model", layouts.SPLIT.files)
    path = tmp_path / "model.yaml"
    path.write_text(f"name: t\nsource: {{layout: {layout}, dir: ./model}}\n")
    return path


def test_config_takes_an_old_spelling_as_the_canonical_name(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        cfg = load_config(_model_yaml(tmp_path, "split"))
    assert cfg.source.layout == "qwen3-asr-split"
    assert [r.getMessage() for r in caplog.records] == [DEPRECATED]


def test_config_refuses_an_unknown_layout_in_one_line_with_exit_code_2(tmp_path):
    path = _model_yaml(tmp_path, "splt")
    result = CliRunner().invoke(main, ["build", str(path)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: {path}: source.layout: expected one of 'qwen3-asr-split', 'merged', 'qwen3-asr-v2'; got 'splt'"]


def test_zoo_takes_the_names_and_the_old_spelling():
    layout = next(p for p in main.commands["zoo"].params if p.name == "layout")
    assert list(layout.type.choices) == ["qwen3-asr-split", "split", "merged"]
    assert layout.default == "qwen3-asr-split"
    result = CliRunner().invoke(main, ["zoo", "tiny", "-o", "x", "--layout", "qwen3-asr-v2"])
    assert result.exit_code == 2 and "'qwen3-asr-v2' is not one of" in result.output

"""model.yaml validation: one clear message per problem, exit code 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from webbuild.cli import main


def write_yaml(tmp_path: Path, text: str) -> Path:
    (tmp_path / "model").mkdir(exist_ok=True)
    path = tmp_path / "model.yaml"
    path.write_text(text)
    return path


def run_build(tmp_path: Path, text: str):
    path = write_yaml(tmp_path, text)
    result = CliRunner().invoke(main, [str(path), "-o", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists(), "a failed build must not write output"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")], "temporary build folder left behind"
    return result


HEAD = "name: t\nsource: {layout: qwen3-asr-split, dir: ./model}\n"


@pytest.mark.parametrize("text, where, expected", [
    ("name: t\nsource: {layout: qwen3-asr-split, dir: ./model}\ncolour: red\n", "colour", "unknown key"),
    ("name: t\nsource: {layout: qwen3-asr-split, dir: ./model}\nshard: {max_bytes: lots}\n",
     "shard.max_bytes", "valid integer"),
    ("name: t\nsource: {layout: qwen3-asr-split, dir: ./nowhere}\n", "source.dir", "does not exist"),
    ("name: t\nsource: {layout: qwen3-asr-splt, dir: ./model}\n", "source.layout", "expected one of"),
    ("name: t\nsource: {layout: qwen3-asr-split}\n", "source.dir", "required key is missing"),
    ("name: t\nsource: {layout: qwen3-asr-split, dir: ./model}\n", "source.dir", "lacks encoder.onnx"),
    ("name: t\nsource: {layout: qwen3-asr-v2, dir: ./model}\n", "source.dir",
     "lacks encoder.onnx, which layout 'qwen3-asr-v2' needs"),  # its own files: tests/test_layout_v2.py
    ("name: t\nsource: {layout: merged, dir: ./model}\nsite: {base_path: sub}\n", "site.base_path", "start"),
    ("name: t\nsource: [1, 2]\n", "source", "valid dictionary"),
    (f"{HEAD}verify: {{min_decode_tokens_per_s: fast}}\n", "verify.min_decode_tokens_per_s",
     "expected tokens/s as a number (every provider) or a mapping such as {webgpu: 2, wasm: 20}; got 'fast'"),
    (f"{HEAD}verify: {{min_decode_tokens_per_s: -1}}\n", "verify.min_decode_tokens_per_s", "expected a floor > 0"),
    (f"{HEAD}verify: {{min_decode_tokens_per_s: {{cpu: 3}}}}\n", "verify.min_decode_tokens_per_s.cpu",
     "unknown key"),
    (f"{HEAD}verify: {{min_decode_tokens_per_s: {{wasm: 0}}}}\n", "verify.min_decode_tokens_per_s.wasm",
     "greater than 0"),
    (f"{HEAD}fusion: {{step_attention: flash}}\n", "fusion.step_attention",
     "expected one of 'direct' or 'gqa'; got 'flash'"),
])
def test_bad_model_yaml(tmp_path, text, where, expected):
    result = run_build(tmp_path, text)
    assert result.exit_code == 2
    line = next(line for line in result.output.splitlines() if f": {where}:" in line)
    assert str(tmp_path / "model.yaml") in line
    assert expected in line


def test_missing_yaml_file(tmp_path):
    result = CliRunner().invoke(main, [str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "no such file" in result.output


def test_minimal_yaml_gets_defaults(tmp_path, zoo_export):
    from webbuild.config import load_config

    path = tmp_path / "model.yaml"
    path.write_text(f"name: tiny-asr\nsource: {{layout: qwen3-asr-split, dir: {zoo_export('qwen3-asr-split')}}}\n")
    cfg = load_config(path)
    assert cfg.variants == ["fp16", "fp32"]
    assert cfg.shard.max_bytes == 25 * 1024 * 1024
    assert cfg.quantize.block_size == 32 and cfg.quantize.accuracy_level == 4
    assert cfg.output == tmp_path / "dist"


def test_relative_source_dir_resolves_against_yaml(tmp_path, zoo_export):
    import shutil

    from webbuild.config import load_config

    shutil.copytree(zoo_export("qwen3-asr-split"), tmp_path / "sub" / "model")
    path = tmp_path / "sub" / "model.yaml"
    path.write_text("name: x\nsource: {layout: qwen3-asr-split, dir: ./model}\n")
    assert load_config(path).source.dir == tmp_path / "sub" / "model"


@pytest.mark.parametrize("floor, floors", [
    (None, {}), (5, {"webgpu": 5, "wasm": 5}), ({"wasm": 20}, {"wasm": 20}),
    ({"webgpu": 0.5, "wasm": 20}, {"webgpu": 0.5, "wasm": 20}),
])
def test_decode_speed_floor_is_one_number_or_one_per_provider(floor, floors):
    from webbuild.config import BuildConfig

    raw = {"name": "t", "source": {"layout": "merged", "dir": "m"}}
    if floor is not None:
        raw["verify"] = {"min_decode_tokens_per_s": floor}
    assert BuildConfig.model_validate(raw).verify.decode_floors() == floors


def test_lead_default_is_the_training_recipes():
    """model.yaml's encoder.lead_ms defaults to the lead the example model was trained with."""
    from webbuild.config import Encoder
    from webbuild.reference.mel import DEFAULT_LEAD_MS

    assert Encoder().lead_ms == DEFAULT_LEAD_MS


@pytest.mark.parametrize("declared", ["merged", "qwen3-asr-v2"])
def test_a_layout_that_is_not_the_exports_names_the_one_it_is(tmp_path, declared):
    """A split export declared as another layout listed the files it lacked, with no hint which layout it is."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "decoder_init.onnx").write_bytes(b"")  # what tells the split layout
    result = run_build(tmp_path, f"name: t\nsource: {{layout: {declared}, dir: ./model}}\n")
    assert (result.exit_code, result.output.splitlines()) == (2, [
        f"error: {tmp_path / 'model.yaml'}: source.layout: {declared!r}, but {tmp_path / 'model'} holds an export "
        "of layout 'qwen3-asr-split' (its decoder_init.onnx); set source.layout: qwen3-asr-split"])


def test_a_validators_message_says_got_once(tmp_path):
    result = run_build(tmp_path, "name: t\nsource: {layout: qwen3-asr-split, dir: ./model}\nsite: {base_path: x}\n")
    line = next(line for line in result.output.splitlines() if "site.base_path" in line)
    assert line.endswith("expected a path that starts and ends with '/', e.g. '/my-repo/', got 'x'"), line


def test_broken_yaml_is_one_line_with_where(tmp_path):
    """YAML's own message spans lines, quotes the text and points with a caret: one line, where and what."""
    result = run_build(tmp_path, "name: t\n  source: x\n")
    assert (result.exit_code, result.output.splitlines()) == (2, [
        f"error: {tmp_path / 'model.yaml'}: not valid YAML at line 2, column 9: mapping values are not allowed here"])

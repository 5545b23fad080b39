"""model.yaml `adapters:`: an adapter that does not fit the base is one line naming the adapter and the
tensor, exit code 2, nothing written; one that fits loads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import save_file

from webbuild.adapters import RANK, TARGET_MODULES, adapter_problems, expected_tensors, tensor_name
from webbuild.cli import main
from webbuild.config import load_config
from webbuild.site.adapter_pack import graph_inputs
from webbuild.site.contract import IO

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny-asr"
BASE = json.loads((EXAMPLE / "model" / "config.json").read_text())


def write_adapter(folder: Path, rank: int = RANK, targets=TARGET_MODULES, drop=(), reshape=None) -> Path:
    """A PEFT-style folder fitting the example's decoder, less the tensors in `drop`, with `reshape`
    = (name, shape) giving one tensor another shape."""
    folder.mkdir(parents=True)
    tensors = {name: np.zeros(shape, np.float16) for name, shape in expected_tensors(BASE, rank).items()
               if name not in drop and name.split(".")[-3] in targets}
    if reshape:
        tensors[reshape[0]] = np.zeros(reshape[1], np.float16)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 32, "target_modules": list(targets)}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def build(tmp_path: Path, adapters: str):
    path = tmp_path / "model.yaml"
    path.write_text(f"name: t\nsource: {{layout: qwen3-asr-split, dir: {EXAMPLE / 'model'}}}\nadapters:\n{adapters}")
    result = CliRunner().invoke(main, [str(path), "-o", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists(), "a failed build must not write output"
    return result


def only_line(result, adapter: str) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if f"({adapter})" in line]
    assert len(lines) == 1, result.output
    return lines[0]


def test_wrong_rank(tmp_path):
    write_adapter(tmp_path / "a", rank=16)
    line = only_line(build(tmp_path, "  - {name: accent, path: a}\n"), "accent")
    assert "adapters[0] (accent): adapter_config.json has r: 16; the build takes rank-32 adapters" in line


def test_missing_target_modules(tmp_path):
    write_adapter(tmp_path / "a", targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    line = only_line(build(tmp_path, "  - {name: attn-only, path: a}\n"), "attn-only")
    assert "target_modules lacks gate_proj, up_proj, down_proj" in line


def test_missing_tensor(tmp_path):
    name = tensor_name(2, "o_proj", "B")
    write_adapter(tmp_path / "a", drop=(name,))
    line = only_line(build(tmp_path, "  - {name: voice, path: a}\n"), "voice")
    assert f"adapters[0] (voice): tensor {name} is missing" in line


def test_shape_not_matching_the_base(tmp_path):
    name = tensor_name(1, "down_proj", "A")  # down_proj takes the 768-wide MLP activations
    write_adapter(tmp_path / "ok", reshape=None)
    write_adapter(tmp_path / "a", reshape=(name, (RANK, 256)))
    result = build(tmp_path, "  - {name: ok, path: ok}\n  - {name: wide, path: a}\n")
    line = only_line(result, "wide")
    assert f"adapters[1] (wide): tensor {name} has shape [32, 256]; the base needs [32, 768]" in line
    assert "(ok)" not in result.output


def test_adapter_of_another_model_is_a_few_lines(tmp_path):
    folder = tmp_path / "a"
    folder.mkdir()
    other = {tensor_name(layer, p, part): np.zeros((RANK, 512) if part == "A" else (512, RANK), np.float16)
             for layer in range(4) for p in TARGET_MODULES for part in "AB"}
    save_file(other, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"r": RANK, "lora_alpha": 32,
                                                            "target_modules": list(TARGET_MODULES)}))
    result = build(tmp_path, "  - {name: big, path: a}\n")
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if "(big)" in line]
    assert len(lines) == 5 and lines[-1].endswith("... and 52 more tensors"), lines


@pytest.mark.parametrize("entry, expected", [
    ("{name: a, path: nowhere}", "adapters[0] (a): folder"),
    ("{name: a, path: empty}", "lacks adapter_config.json and adapter_model.safetensors"),
    ("{name: a, path: ok, precision: int4}", "adapters[0].precision: expected one of 'int8', 'fp16' or 'fp32'"),
    ("{name: a, path: ok, scale: 0}", "adapters[0].scale: Input should be greater than 0"),
    ("{name: A b, path: ok}", "adapters[0].name: got 'A b'"),
])
def test_bad_entries(tmp_path, entry, expected):
    write_adapter(tmp_path / "ok")
    (tmp_path / "empty").mkdir()
    result = build(tmp_path, f"  - {entry}\n")
    assert result.exit_code == 2
    assert expected in result.output


def test_names_are_unique(tmp_path):
    write_adapter(tmp_path / "ok")
    result = build(tmp_path, "  - {name: a, path: ok}\n  - {name: a, path: ok}\n")
    assert result.exit_code == 2 and "adapter name 'a' is used twice" in result.output


def test_fitting_adapter_loads_with_its_settings(tmp_path):
    write_adapter(tmp_path / "ok")
    path = tmp_path / "model.yaml"
    path.write_text(f"name: t\nsource: {{layout: qwen3-asr-split, dir: {EXAMPLE / 'model'}}}\n"
                    "adapters:\n  - {name: voice, path: ok, scale: 0.5, precision: fp16}\n")
    (adapter,) = load_config(path).adapters
    assert (adapter.name, adapter.path, adapter.scale, adapter.precision) == ("voice", tmp_path / "ok", 0.5, "fp16")
    assert [a.name for a in load_config(EXAMPLE / "model.yaml").adapters] == ["klatt"]


def test_shipped_adapter_fits_the_example(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text(f"name: t\nsource: {{layout: qwen3-asr-split, dir: {EXAMPLE / 'model'}}}\n"
                    f"adapters:\n  - {{name: klatt, path: {EXAMPLE / 'adapters' / 'klatt'}}}\n")
    assert [a.name for a in load_config(path).adapters] == ["klatt"]


def test_source_without_decoder_dimensions(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for f in (EXAMPLE / "model").iterdir():
        (source / f.name).symlink_to(f)
    (source / "config.json").unlink()
    (source / "config.json").write_text(json.dumps({"decoder": {"hidden_size": 256}}))
    write_adapter(tmp_path / "ok")
    path = tmp_path / "model.yaml"
    path.write_text(f"name: t\nsource: {{layout: qwen3-asr-split, dir: {source}}}\n"
                    "adapters:\n  - {name: voice, path: ok}\n")
    result = CliRunner().invoke(main, [str(path), "-o", str(tmp_path / "out")])
    line = only_line(result, "voice")
    assert "the source's config.json lacks decoder.num_attention_heads" in line


@pytest.mark.parametrize("setting, expected", [
    ({"peft_type": "LOHA"}, "adapter_config.json has peft_type: 'LOHA'; the build takes LoRA adapters"),
    ({"use_dora": True}, "adapter_config.json has use_dora: True, which DoRA rescales the base weights"),
    ({"bias": "lora_only"}, "adapter_config.json has bias: 'lora_only', which trains biases"),
    ({"modules_to_save": ["lm_head"]}, "adapter_config.json has modules_to_save: ['lm_head'], which saves whole"),
    ({"rank_pattern": {"q_proj": 16}}, "adapter_config.json has rank_pattern: {'q_proj': 16}, which gives some"),
    ({"alpha_pattern": {"q_proj": 8}}, "adapter_config.json has alpha_pattern: {'q_proj': 8}, which gives some"),
    ({"fan_in_fan_out": True}, "adapter_config.json has fan_in_fan_out: True, which stores the matrices transposed"),
])
def test_peft_settings_that_are_not_a_plain_update(tmp_path, setting, expected):
    """A PEFT setting base + B·A·x cannot express is refused by name, not built into another model."""
    folder = write_adapter(tmp_path / "a")
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, **setting}))
    line = only_line(build(tmp_path, "  - {name: peft, path: a}\n"), "peft")
    assert f"adapters[0] (peft): {expected}" in line


def test_peft_defaults_and_a_regex_target_are_accepted(tmp_path):
    """The settings PEFT writes by default, and target_modules as PEFT's regular expression: the tensors decide."""
    folder = write_adapter(tmp_path / "a")
    config = json.loads((folder / "adapter_config.json").read_text())
    config.update(target_modules=r".*\.(q|k|v|o|gate|up|down)_proj", use_dora=False, bias="none",
                  modules_to_save=None, rank_pattern={}, alpha_pattern={}, fan_in_fan_out=False, use_rslora=False,
                  lora_dropout=0.05)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    assert adapter_problems(folder, BASE) == []


@pytest.mark.parametrize("rslora, factor", [(False, 64 / RANK), (True, 64 / RANK ** 0.5)])
def test_the_update_is_scaled_as_peft_scales_it(tmp_path, rslora, factor):
    """up = (B * lora_alpha / r * scale)^T; with use_rslora (rank-stabilised LoRA) lora_alpha / sqrt(r)."""
    folder = tmp_path / "a"
    folder.mkdir()
    rng = np.random.default_rng(0)
    tensors = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in expected_tensors(BASE).items()}
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": RANK, "lora_alpha": 64, "target_modules": list(TARGET_MODULES),
              "use_rslora": rslora}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    inputs = graph_inputs(folder, BASE["decoder"]["num_layers"], scale=0.5)
    a, b = tensors[tensor_name(1, "o_proj", "A")], tensors[tensor_name(1, "o_proj", "B")]
    np.testing.assert_allclose(inputs[IO.lora_input(1, "o_proj", "up")], (b * factor * 0.5).T, rtol=1e-6)
    np.testing.assert_array_equal(inputs[IO.lora_input(1, "o_proj", "down")], a.T)


def test_adapter_that_also_adapts_the_audio_encoder(tmp_path):
    """PEFT's target_modules by leaf name also catch the audio encoder's q/k/v_proj: one line says so and how
    to train for the decoder alone."""
    folder = write_adapter(tmp_path / "a")
    tensors = {name: np.zeros(shape, np.float16) for name, shape in expected_tensors(BASE).items()}
    for layer in range(2):
        for proj in ("q_proj", "k_proj", "v_proj"):
            for part, shape in (("A", (RANK, 64)), ("B", (64, RANK))):
                tensors[f"base_model.model.model.audio_tower.layers.{layer}.self_attn.{proj}.lora_{part}.weight"] = \
                    np.zeros(shape, np.float16)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    line = only_line(build(tmp_path, "  - {name: both, path: a}\n"), "both")
    assert "adapters[0] (both): 12 tensors adapt the audio encoder" in line
    assert 'train with target_modules=r".*language_model.*\\.(q|k|v|o|gate|up|down)_proj"' in line
    assert adapter_problems(folder, BASE) == [line.split("(both): ", 1)[1]]

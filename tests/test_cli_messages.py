"""The CLI's messages (issue 17): bad model files, typo'd commands, busy ports, help on every option,
plurals, sizes and output paths. Errors run the real command line in a subprocess and must be one
`error:` line on stderr with exit code 2, never a traceback."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import click
import pytest

from tests.command import webbuild
from tests.example_config import EXAMPLE
from webbuild.cli import main
from webbuild.errors import SourceError
from webbuild.graph.load import load_onnx
from webbuild.text import plural, size

FIX = "re-export or re-download the model"



def one_error_line(r: subprocess.CompletedProcess) -> str:
    """The single `error: ...` line of a failed command (progress lines before it are allowed)."""
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and r.stderr.rstrip().endswith(errors[0]), r.stderr
    return errors[0]


def _source_copy(tmp_path: Path) -> tuple[Path, Path]:
    """(model.yaml, model folder) of the example with links to its files: a test may then replace one."""
    model = tmp_path / "model"
    model.mkdir()
    for f in (EXAMPLE / "model").iterdir():
        (model / f.name).symlink_to(f)
    samples = "\n".join(f"    - {{audio: {EXAMPLE / 'samples' / f'sample-{i}.wav'}, text: x}}" for i in (1, 2))
    config = tmp_path / "model.yaml"
    config.write_text(f"name: t\nsource: {{layout: qwen3-asr-split, dir: ./model}}\nsite:\n  samples:\n{samples}\n")
    return config, model


def _replace(path: Path, data: bytes) -> None:
    path.unlink()
    path.write_bytes(data)


@pytest.fixture
def truncated(tmp_path):
    config, model = _source_copy(tmp_path)
    _replace(model / "decoder_weights.data", (EXAMPLE / "model" / "decoder_weights.data").read_bytes()[:5_000_000])
    return config, model


@pytest.fixture
def corrupt(tmp_path):
    config, model = _source_copy(tmp_path)
    _replace(model / "decoder_init.onnx", (EXAMPLE / "model" / "decoder_init.onnx").read_bytes()[:50_000])
    return config, model


def test_truncated_weights_file_is_one_line_and_exit_code_2(truncated, tmp_path):
    config, model = truncated
    line = one_error_line(webbuild(config, "-o", tmp_path / "dist"))
    assert line.startswith(f"error: stage source: {model / 'decoder_weights.data'}: truncated (5000000 bytes; ")
    assert line.endswith(FIX)
    assert not (tmp_path / "dist").exists() and not list(tmp_path.glob(".dist-*"))  # no partial output


def test_corrupt_graph_is_one_line_and_exit_code_2_in_every_command(corrupt, tmp_path):
    config, model = corrupt
    expected = f"{model / 'decoder_init.onnx'}: not an ONNX model ("
    assert expected in one_error_line(webbuild(config, "-o", tmp_path / "dist"))
    assert expected in one_error_line(webbuild("fuse", model, "-o", tmp_path / "fused"))
    assert not (tmp_path / "fused").exists()
    line = one_error_line(webbuild("transcribe", model, EXAMPLE / "samples" / "sample-1.wav"))
    assert expected in line and line.endswith(FIX)


def test_fuse_and_transcribe_check_the_weights_file_too(truncated, tmp_path):
    _, model = truncated
    assert "decoder_weights.data: truncated" in one_error_line(webbuild("fuse", model, "-o", tmp_path / "f"))
    assert "decoder_weights.data: truncated" in one_error_line(
        webbuild("transcribe", model, EXAMPLE / "samples" / "sample-1.wav"))


@pytest.mark.parametrize("data, reason", [(b"", "no graph in its 0 bytes"), (b"hello world\n", "not an ONNX model")])
def test_load_onnx_names_the_problem(tmp_path, data, reason):
    path = tmp_path / "g.onnx"
    path.write_bytes(data)
    with pytest.raises(SourceError, match=reason):
        load_onnx(path)


def test_load_onnx_missing_weights_file(tmp_path):
    _, model = _source_copy(tmp_path)
    (model / "decoder_weights.data").unlink()
    with pytest.raises(SourceError, match="its weights file decoder_weights.data is missing; " + FIX):
        load_onnx(model / "decoder_step.onnx")


def test_typod_subcommand_suggests_the_command():
    assert one_error_line(webbuild("servee", "dist")) == "error: no such command 'servee'; did you mean 'serve'?"
    assert one_error_line(webbuild("-v", "bild", "x.yaml")) == "error: no such command 'bild'; did you mean 'build'?"
    line = one_error_line(webbuild("frobnicate"))
    assert "'frobnicate' is neither a command (build, init, zoo" in line and "nor a model.yaml file" in line


def test_a_model_yaml_is_still_the_default_command(tmp_path):
    # names that could be mistaken for commands still go to `build` when they are files or paths
    (tmp_path / "model").write_text("name: [\n")
    for arg in (tmp_path / "model", "missing.yaml", "some/dir"):
        assert "no such command" not in one_error_line(webbuild(arg)), arg


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    (site / "model").mkdir(parents=True)
    (site / "index.html").write_text("<!doctype html>")
    (site / "model" / "manifest.json").write_text("{}")
    return site


def test_busy_port_names_the_port_and_the_option(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = one_error_line(webbuild("serve", _site(tmp_path), "--port", port, timeout=60))
    assert line == f"error: port {port} is in use: pick another with --port"


def test_serve_refuses_a_folder_that_is_not_a_built_site(tmp_path):
    (tmp_path / "index.html").write_text("<!doctype html>")
    line = one_error_line(webbuild("serve", tmp_path, timeout=60))
    assert line == (f"error: {tmp_path} is not a built site (no model/manifest.json); "
                    "`webbuild model.yaml` builds one into dist/")


@pytest.mark.parametrize("bad", ["cpu=3", "0", "wasm=fast"])
def test_decode_speed_floor_option_names_its_forms(bad):
    r = webbuild("verify", "dist", "--min-decode-tokens-per-s", bad, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.rstrip().splitlines()[-1] == (
        "Error: Invalid value for '--min-decode-tokens-per-s': expected N or PROVIDER=N, N > 0 tokens/s and "
        f"PROVIDER one of webgpu, wasm (e.g. 20 or wasm=20); got '{bad}'")


def _commands(group: click.Group, prefix: str = "webbuild"):
    yield prefix, group
    for name, cmd in group.commands.items():
        yield from _commands(cmd, f"{prefix} {name}") if isinstance(cmd, click.Group) else [(f"{prefix} {name}", cmd)]


def test_every_option_of_every_command_has_help():
    bare = [f"{path} {'/'.join(p.opts)}" for path, cmd in _commands(main) for p in cmd.params
            if isinstance(p, click.Option) and not (p.help or "").strip()]
    assert bare == []


def test_counts_and_sizes_read_one_way():
    assert [plural(n, "clip") for n in (0, 1, 4)] == ["0 clips", "1 clip", "4 clips"]
    assert [size(n) for n in (512, 25 * 2**20, 36_500_000, 3 * 2**30)] == [
        "512 B", "25.0 MiB", "34.8 MiB", "3.00 GiB"]


def test_build_log_shows_final_paths_and_binary_sizes(example_build):
    r, out = example_build, example_build.dist
    assert f"/.{out.name}-" not in r.stderr + r.stdout  # the staging folder is gone once the build ends
    assert "fused decoder.onnx: " in r.stderr and r.stderr.rstrip().endswith(f"wrote {out}")
    assert " MB" not in r.stdout and "MiB" in r.stdout


def test_output_that_is_not_an_earlier_build_is_left_alone(tmp_path):
    """The output folder is replaced whole: a non-empty folder without build-report.json is refused,
    before any stage runs, and keeps its files; an earlier build is replaced."""
    out = tmp_path / "home"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    r = webbuild(EXAMPLE / "model.yaml", "-o", out)
    assert r.returncode == 2 and "no build-report.json" in one_error_line(r) and "-o" in one_error_line(r)
    assert (out / "notes.txt").read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["home"]


@pytest.mark.parametrize("option", ["--max-chunk-seconds", "--join-seconds"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_float_option_that_is_no_finite_number_is_one_line(option, value, tmp_path):
    run = webbuild("transcribe", tmp_path, tmp_path / "a.wav", option, value)
    assert run.returncode == 2 and f"Invalid value for '{option}': " in run.stderr and "Traceback" not in run.stderr


def test_a_variant_the_model_lacks_is_one_line_naming_those_it_has(example_dist):
    """`--variant fp8` was accepted and exited 0: on a built site it names the site's variants, on a source
    export (which has none) it says what --variant is for."""
    wav = EXAMPLE / "samples" / "sample-1.wav"
    assert one_error_line(webbuild("transcribe", example_dist, wav, "--variant", "fp8")) == (
        f"error: {example_dist / 'model'}: no variant 'fp8'; the site has fp16, fp32")
    assert one_error_line(webbuild("transcribe", EXAMPLE / "model", wav, "--variant", "fp8")) == (
        f"error: {EXAMPLE / 'model'}: --variant fp8 picks one of a built site's variants, and this is a source "
        "export, whose graphs have one precision; leave --variant out, or pass a built site's folder")


def test_a_folder_given_as_model_yaml_says_what_to_give(example_dist, tmp_path):
    """`webbuild FOLDER` said "no such file": it names the model.yaml inside, `init` for an export, `serve` for a
    built site."""
    assert one_error_line(webbuild(EXAMPLE)) == (
        f"error: {EXAMPLE} is a folder, not a model.yaml; pass the one inside it: webbuild {EXAMPLE / 'model.yaml'}")
    assert one_error_line(webbuild(EXAMPLE / "model")) == (
        f"error: {EXAMPLE / 'model'} is a folder holding an export (layout qwen3-asr-split), not a model.yaml; "
        f"write one for it with `webbuild init {EXAMPLE / 'model'}`, then build that")
    assert one_error_line(webbuild(example_dist)) == (
        f"error: {example_dist} is a built site, not a model.yaml; preview it with `webbuild serve {example_dist}`")
    assert one_error_line(webbuild(tmp_path)) == (
        f"error: {tmp_path} is a folder, not a model.yaml; pass the path of a model.yaml (`webbuild init "
        "EXPORT_FOLDER` writes one)")

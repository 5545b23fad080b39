"""The CLI's shape: subcommands, help with examples, and input errors."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from webbuild.cli import main
from webbuild.reference.audio import write_wav

SUBCOMMANDS = ["build", "zoo", "fuse", "transcribe", "serve", "verify", "bench"]


def test_help_lists_subcommands():
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for name in SUBCOMMANDS:
        assert f"  {name} " in result.output


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_every_command_explains_itself_with_an_example(name):
    result = CliRunner().invoke(main, [name, "--help"])
    assert result.exit_code == 0
    assert "Example" in result.output and f"webbuild {name}" in result.output


@pytest.mark.torch  # without the zoo extra `webbuild zoo` says so first (tests/test_install.py)
def test_zoo_rejects_unknown_preset(tmp_path):
    result = CliRunner().invoke(main, ["zoo", "huge", "-o", str(tmp_path / "z")])
    assert result.exit_code == 2
    assert "neither a preset" in result.output
    assert not (tmp_path / "z").exists()


def test_transcribe_json_lines(zoo_export, tmp_path):
    clip = tmp_path / "a.wav"
    write_wav(clip, np.random.RandomState(0).randn(20000) * 0.05)
    result = CliRunner().invoke(main, ["transcribe", str(zoo_export("qwen3-asr-split")), str(clip), "--json",
                                       "--max-new-tokens", "3"])
    assert result.exit_code == 0, result.output
    import json

    rows = [json.loads(line) for line in result.output.splitlines()]
    assert rows[0]["audio"] == str(clip) and isinstance(rows[0]["text"], str)


def test_transcribe_unreadable_audio(zoo_export, tmp_path):
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not a wav at all")
    result = CliRunner().invoke(main, ["transcribe", str(zoo_export("qwen3-asr-split")), str(bad)])
    assert result.exit_code == 2
    assert "bad.wav" in result.output and "not a WAV file" in result.output


def test_transcribe_bad_model_dir(tmp_path):
    clip = tmp_path / "a.wav"
    write_wav(clip, np.zeros(8000))
    result = CliRunner().invoke(main, ["transcribe", str(tmp_path), str(clip)])
    assert result.exit_code == 2
    assert "config.json" in result.output


def test_transcribe_folder_with_transcripts_reports_wer(zoo_export, tmp_path):
    import json

    for name in ("b", "a"):
        write_wav(tmp_path / f"{name}.wav", np.random.RandomState(1).randn(9000) * 0.05)
    (tmp_path / "a.txt").write_text("hello world\n")
    result = CliRunner().invoke(main, ["transcribe", str(zoo_export("qwen3-asr-split")), str(tmp_path),
                                                       "--json", "--max-new-tokens", "2"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["audio"] for r in rows] == [str(tmp_path / "a.wav"), str(tmp_path / "b.wav")]
    assert rows[0]["expected"] == "hello world" and rows[0]["wer"] >= 0.0 and "wer" not in rows[1]
    assert "over 1 clip" in result.stderr and "over 1 clips" not in result.stderr


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny-asr"


def test_fuse_quantizes_by_default_and_the_result_transcribes(tmp_path):
    """`webbuild fuse` on the trained example: the fused int4 decoder (input_ids + int4 lookup), driven
    by the Python reference with the source's encoder, still reads every sample right."""
    import json

    import yaml
    from tokenizers import Tokenizer

    from webbuild.reference.audio import read_wav
    from webbuild.reference.transcribe import IdsDecoder, TokenizerCodec, Transcriber, cpu_session

    src = EXAMPLE / "model"
    result = CliRunner().invoke(main, ["fuse", str(src), "-o", str(tmp_path / "q"),
                                       "--report", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    assert "quantizing" in result.output and "MatMulNBits" in result.output
    assert json.loads((tmp_path / "r.json").read_text())["quantize"]["settings"]["block_size"] == 32
    cfg = json.loads((src / "config.json").read_text())
    t = Transcriber(cpu_session(src / "encoder.onnx"), IdsDecoder(tmp_path / "q" / "decoder.onnx", cfg["decoder"]),
                    TokenizerCodec(Tokenizer.from_file(str(src / "tokenizer.json"))),
                    frozenset(cfg["special_tokens"]["eos_token_ids"]))
    samples = yaml.safe_load((EXAMPLE / "model.yaml").read_text())["site"]["samples"]
    assert [t.transcribe(read_wav(EXAMPLE / s["audio"])) for s in samples] == [s["text"] for s in samples]


def test_fuse_no_quantize_and_missing_side_files(tmp_path):
    result = CliRunner().invoke(main, ["fuse", str(EXAMPLE / "model"), "-o", str(tmp_path / "f"), "--no-quantize"])
    assert result.exit_code == 0, result.output
    assert "quantizing" not in result.output and "MatMulNBits" not in result.output
    # the fused graph alone, without config.json / embed_tokens.bin beside it: nothing to quantize the lookup from
    result = CliRunner().invoke(main, ["fuse", str(tmp_path / "f" / "decoder.onnx"), "-o", str(tmp_path / "q")])
    assert result.exit_code == 2 and "--no-quantize" in result.output
    assert not (tmp_path / "q").exists()  # checked before anything is written


def _build_with(monkeypatch, tmp_path, stage, *args: str):
    """`webbuild examples/tiny-asr/model.yaml` with `stage` as its only stage."""
    import webbuild.pipeline.runner

    monkeypatch.setattr(webbuild.pipeline.runner, "STAGES", [("probe", stage)])
    return CliRunner().invoke(main, [str(EXAMPLE / "model.yaml"), "-o", str(tmp_path / "out"), *args])


def test_a_bug_in_a_stage_is_a_traceback_not_an_input_error(monkeypatch, tmp_path):
    def stage(ctx):
        return {}["missing"]

    result = _build_with(monkeypatch, tmp_path, stage)
    assert result.exit_code == 1 and isinstance(result.exception, KeyError)
    assert "error:" not in result.output and not (tmp_path / "out").exists()


def test_bad_input_found_by_a_stage_is_one_line_and_exit_code_2(monkeypatch, tmp_path):
    from webbuild.errors import AudioError

    def stage(ctx):
        raise AudioError("clip.wav: not a readable WAV file")

    result = _build_with(monkeypatch, tmp_path, stage)
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert [line for line in result.stderr.splitlines() if "error" in line] == [
        "error: stage probe: clip.wav: not a readable WAV file"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, debug", [((), False), (("-v",), True)])
def test_progress_is_logged_as_timed_lines_and_verbose_adds_debug(monkeypatch, tmp_path, args, debug):
    import logging

    def stage(ctx):
        log = logging.getLogger("webbuild.pipeline.probe")
        log.info("info line")
        log.debug("debug line")
        log.warning("warning line")
        logging.getLogger("onnxscript.probe").info("third-party info line")
        ctx.state.manifest = {"shards": []}

    result = _build_with(monkeypatch, tmp_path, stage, *args)
    assert result.exit_code == 0, result.output
    stamped = [re.fullmatch(r"\[ *\d+\.\ds\] (.*)", line) for line in result.stderr.splitlines()]
    assert all(stamped), result.stderr
    lines = [m[1] for m in stamped]
    expected = ["stage probe", "info line", *(["debug line"] if debug else []), "warning: warning line",
                f"wrote {tmp_path / 'out'}"]
    assert lines == expected

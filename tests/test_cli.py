"""The CLI's shape: subcommands, help with examples, and input errors."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from pipeline.audio import write_wav
from pipeline.cli import main

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


def test_zoo_rejects_unknown_preset(tmp_path):
    result = CliRunner().invoke(main, ["zoo", "huge", "-o", str(tmp_path / "z")])
    assert result.exit_code == 2
    assert "neither a preset" in result.output
    assert not (tmp_path / "z").exists()


def test_transcribe_json_lines(zoo_export, tmp_path):
    clip = tmp_path / "a.wav"
    write_wav(clip, np.random.RandomState(0).randn(20000) * 0.05)
    result = CliRunner().invoke(main, ["transcribe", str(zoo_export("split")), str(clip), "--json",
                                       "--max-new-tokens", "3"])
    assert result.exit_code == 0, result.output
    import json

    rows = [json.loads(l) for l in result.output.splitlines()]
    assert rows[0]["audio"] == str(clip) and isinstance(rows[0]["text"], str)


def test_transcribe_unreadable_audio(zoo_export, tmp_path):
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not a wav at all")
    result = CliRunner().invoke(main, ["transcribe", str(zoo_export("split")), str(bad)])
    assert result.exit_code == 2
    assert "bad.wav" in result.output and "not a readable WAV" in result.output


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
    result = CliRunner().invoke(main, ["transcribe", str(zoo_export("split")), str(tmp_path),
                                                       "--json", "--max-new-tokens", "2"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(l) for l in result.stdout.splitlines()]
    assert [r["audio"] for r in rows] == [str(tmp_path / "a.wav"), str(tmp_path / "b.wav")]
    assert rows[0]["expected"] == "hello world" and 0.0 <= rows[0]["wer"] and "wer" not in rows[1]
    assert "over 1 clips" in result.stderr

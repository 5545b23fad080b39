"""What the bad-input tests and the fuzz harness share: a writable copy of the embedded example's inputs, a
way to replace one of its files, and the CLI run in-process (click's CliRunner: no interpreter start per
case) with the checks every outcome must pass: exit 0, or exit 2 with one `error:` line and no traceback."""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner

from tests.example_config import EXAMPLE
from webbuild.cli import main

SAMPLES = [EXAMPLE / "samples" / f"sample-{i}.wav" for i in (1, 2)]


def link_tree(src: Path, dest: Path) -> Path:
    """`src` copied as hard links where the file system allows (tests replace files, never write into one),
    but for weights files (*.data), which the ONNX reader refuses to read through a link."""
    def link(a, b):
        try:
            if a.endswith(".data"):
                raise OSError
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dest, copy_function=link)
    return dest


def source_copy(folder: Path, adapters: bool = False) -> tuple[Path, Path]:
    """(model.yaml, model folder): the example's source export and two samples under `folder`."""
    model = link_tree(EXAMPLE / "model", folder / "model")
    samples = "\n".join(f"    - {{audio: {wav}, text: x}}" for wav in SAMPLES)
    extra = ""
    if adapters:
        link_tree(EXAMPLE / "adapters" / "klatt", folder / "klatt")
        extra = "adapters:\n  - {name: klatt, path: ./klatt}\n"
    config = folder / "model.yaml"
    config.write_text(f"name: t\nsource: {{layout: qwen3-asr-split, dir: ./model}}\nsite:\n  samples:\n{samples}\n"
                      + extra)
    return config, model


def replace(path: Path, data: bytes) -> None:
    """A new file at `path` (the old one may be a hard link to the example's: never written into)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    path.write_bytes(data)


@dataclass
class Outcome:
    code: int
    stderr: str
    exception: BaseException | None

    def error_line(self) -> str:
        """The one `error:` line of a failed run: exit code 2, no traceback, the line last."""
        assert self.code == 2, (self.code, self.stderr, self.exception)
        assert "Traceback" not in self.stderr, self.stderr
        errors = [line for line in self.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and self.stderr.rstrip().endswith(errors[0]), self.stderr
        return errors[0]

    def ok_or_error_lines(self) -> list[str]:
        """[] for exit 0, else the `error:` lines that end the output: one, or for an invalid model.yaml one
        per problem (ConfigError); an AssertionError for anything else (a traceback, another exit code)."""
        if self.code == 0:
            return []
        assert self.code == 2, (self.code, self.stderr, self.exception)
        assert "Traceback" not in self.stderr, self.stderr
        lines = self.stderr.rstrip().splitlines()
        errors = [line for line in lines if line.startswith("error: ")]
        assert errors and lines[-len(errors):] == errors, self.stderr
        return errors


def invoke(*args) -> Outcome:
    """`webbuild ARGS` in this process."""
    result = CliRunner().invoke(main, [str(a) for a in args])
    bug = result.exception if not isinstance(result.exception, SystemExit) else None
    return Outcome(result.exit_code, result.stderr, bug)

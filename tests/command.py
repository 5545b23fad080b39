"""The `webbuild` command line in a subprocess, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.example_config import REPO


def webbuild(*args, timeout: float = 1800, cwd=REPO, **kw) -> subprocess.CompletedProcess:
    """`python -m webbuild.cli ARGS` in `cwd` (default: the repository root), this checkout's webbuild first on
    the path; text output captured."""
    env = {**kw.pop("env", os.environ), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "webbuild.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout, **kw)


def parse_command(line: str) -> tuple[str, dict]:
    """A `webbuild ...` line of a doc or workflow through the command line's parser, without running it:
    (the command's name, its parameters); a usage error names the line."""
    import shlex

    import click

    from webbuild.cli import main

    _, *args = shlex.split(line)
    name = args[0] if args[0] in main.commands else "build"  # `webbuild model.yaml` is `webbuild build ...`
    try:
        return name, main.commands[name].make_context(name, args[1:] if name == args[0] else args).params
    except click.UsageError as exc:
        raise AssertionError(f"{line}: {exc}") from None

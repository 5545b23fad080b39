"""The `webbuild` command line in a subprocess, as a user runs it."""

from __future__ import annotations

import subprocess
import sys

from tests.example_config import REPO


def webbuild(*args, timeout: float = 1800, **kw) -> subprocess.CompletedProcess:
    """`python -m webbuild.cli ARGS` from the repository root; text output captured."""
    return subprocess.run([sys.executable, "-m", "webbuild.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout, **kw)

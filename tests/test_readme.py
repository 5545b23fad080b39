"""README.md as written: every command of its sh blocks runs from the root of a fresh clone (scripts/
readme_commands.py, with the README's `needs:` and `(Ctrl-C stops)` conventions), and leaves no file there
that git would see (what the commands write inside the clone is ignored). `make site`, the first command,
installs from the package index and npm: minutes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.checkout import copy_tracked
from tests.example_config import REPO

pytestmark = [pytest.mark.install, pytest.mark.slow]
SCRIPT = REPO / "scripts" / "readme_commands.py"


def test_every_readme_command_runs_from_a_fresh_clone(tmp_path):
    clone = copy_tracked(tmp_path / "clone")
    git = {"cwd": clone, "capture_output": True, "text": True, "check": True}
    subprocess.run(["git", "init", "-q"], **git)
    subprocess.run(["git", "add", "-A"], **git)
    subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@localhost", "commit", "-qm", "clone"], **git)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    listed = subprocess.run([sys.executable, SCRIPT, "--list"], env=env, **git)
    runs = [line for line in listed.stdout.splitlines() if line.startswith("run: ")]
    assert runs[0] == "run: make site   # fresh machine: sets up .venv (no torch) and builds the embedded example " \
                      "(examples/tiny-asr) into dist/" and len(runs) >= 10
    r = subprocess.run([sys.executable, SCRIPT, "--root", clone, clone / "README.md"], cwd=clone, env=env,
                       capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stdout[-6000:]
    assert sum(line.startswith("ok ") for line in r.stdout.splitlines()) == len(runs), r.stdout
    status = subprocess.run(["git", "status", "--porcelain"], **git).stdout
    assert status == "", f"the README's commands left files git sees:\n{status}"

"""scripts/ stays runnable and findable: every script answers --help with its usage (exit 0, no GPU,
torch or browser needed), scripts/README.md names every file there, and no file of the repository
names a script that is gone, unless it names the commit to get it back from (`git show C:scripts/F`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"
RUNNERS = {".sh": ["bash"], ".py": [sys.executable], ".mjs": ["node"]}
NOT_RUN = {".html", ".md"}  # a page the bench serves, the README
SKIP_DIRS = {".git", ".venv", "node_modules", "dist", "build", ".cache", "__pycache__"}
TEXT = {".md", ".py", ".sh", ".mjs", ".js", ".html", ".toml", ".yaml", ".yml", ".json", ".txt", ".cfg"}
# scripts/NAME, or C:scripts/NAME (a commit that had it); a path with a folder before it
# (/tmp/wb2/scripts/..., .wb2/scripts/...) is a copy of this folder and is checked the same way
NEAR = 12  # lines between a removed script's citation and the command that runs it from that commit
SCRIPT_REF = re.compile(r"(?:\b([0-9a-f]{7,40}):)?(?<![\w-])scripts/([\w.-]*\w)")


def scripts() -> list[Path]:
    return sorted(p for p in SCRIPTS.iterdir() if p.is_file() and p.suffix not in NOT_RUN)


def help_problem(script: Path) -> str | None:
    """Why `script --help` does not print its usage, or None when it does."""
    runner = RUNNERS.get(script.suffix)
    if runner is None:
        return f"{script.name}: no runner for {script.suffix!r} files ({', '.join(RUNNERS)})"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OUT": "/nonexistent-out"}  # a script that runs would fail
    try:
        proc = subprocess.run([*runner, str(script), "--help"], capture_output=True, text=True, timeout=60,
                              cwd=REPO, env=env, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return f"{script.name} --help ran for a minute: it does not answer --help"
    if proc.returncode != 0:
        return f"{script.name} --help exited {proc.returncode}: {(proc.stderr or proc.stdout)[-500:]}"
    if not proc.stdout.lstrip().lower().startswith("usage:"):
        return f"{script.name} --help does not begin with 'usage:': {proc.stdout[:200]!r}"
    return None


def test_the_scripts_are_found():
    names = {p.name for p in scripts()}
    assert {"gpu_bench.sh", "chrome_gpu_bench.sh", "train_on_device.sh",
            "e2e_summary.py"} <= names


@pytest.mark.parametrize("script", scripts(), ids=lambda p: p.name)
def test_script_prints_its_usage_on_help(script):
    if script.suffix == ".mjs" and not shutil.which("node"):
        pytest.skip("no node")
    assert help_problem(script) is None, help_problem(script)


def test_a_script_without_help_is_caught(tmp_path):
    runs_anyway = tmp_path / "probe.sh"
    runs_anyway.write_text('#!/usr/bin/env bash\necho "measuring $1"\n')
    assert "does not begin with 'usage:'" in help_problem(runs_anyway)
    fails = tmp_path / "probe.py"
    fails.write_text("import sys\nsys.exit(f'unknown option {sys.argv[1]}')\n")
    assert "exited 1" in help_problem(fails)
    assert "no runner" in help_problem(tmp_path / "probe.rb")


def test_the_readme_names_every_file_in_scripts():
    readme = (SCRIPTS / "README.md").read_text()
    files = [p.name for p in SCRIPTS.iterdir() if p.is_file() and p.name != "README.md"]
    missing = [name for name in files if f"`{name}`" not in readme]
    assert not missing, f"scripts/README.md does not name: {', '.join(missing)}"


def _text_files():
    """The checkout's own text files: tracked or not yet, but none that git ignores (the device calls' staged
    copies of the tree, such as .wb2, hold an older scripts/)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    for rel in listed:
        path = REPO / rel
        text = path.suffix in TEXT or path.name == "Makefile"
        if text and not SKIP_DIRS & set(path.relative_to(REPO).parts) and path.is_file():
            yield path


def _in_commit(commit: str, name: str) -> bool:
    return subprocess.run(["git", "cat-file", "-e", f"{commit}:scripts/{name}"], cwd=REPO,
                          capture_output=True, check=False).returncode == 0


def test_no_reference_to_a_script_that_is_gone():
    """A removed script is cited as `git show C:scripts/F` with a commit C that has it (checked where
    the clone has history); a plain scripts/F must exist, or be such a citation's command to run in a
    checkout of C, within NEAR lines of it."""
    history = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=REPO, capture_output=True,
                             text=True, check=False).stdout.strip() == "false"
    dangling = []
    for path in _text_files():
        lines = path.read_text(errors="replace").splitlines()
        cited: dict[str, list[int]] = {}  # removed script -> lines that cite it with a commit
        plain = []
        for i, line in enumerate(lines):
            for m in SCRIPT_REF.finditer(line):
                commit, name = m.groups()
                if "." not in name:  # a folder (`scripts/`), not a file
                    continue
                if commit is None:
                    plain.append((i, name, m.group(0)))
                elif history and not _in_commit(commit, name):
                    dangling.append(f"{path.relative_to(REPO)}:{i + 1}: {m.group(0)} (not in {commit})")
                else:
                    cited.setdefault(name, []).append(i)
        for i, name, ref in plain:
            if not (SCRIPTS / name).is_file() and not any(abs(i - j) <= NEAR for j in cited.get(name, [])):
                dangling.append(f"{path.relative_to(REPO)}:{i + 1}: {ref}")
    assert not dangling, "\n".join(dangling)

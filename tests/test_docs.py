"""docs/architecture.md names every package of webbuild/ (every folder with an __init__.py) and the
site template, so that the map of the house cannot fall behind a new package; docs/ci.md's workflow
runs only commands and options that webbuild has."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.command import parse_command

REPO = Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO / "docs" / "architecture.md"
CI = REPO / "docs" / "ci.md"


def _packages() -> list[str]:
    folders = [p.parent for p in (REPO / "webbuild").rglob("__init__.py")] + [REPO / "webbuild" / "template"]
    return sorted(f"{folder.relative_to(REPO).as_posix()}/" for folder in folders)


def test_every_package_is_named_in_the_architecture_page():
    text = ARCHITECTURE.read_text()
    missing = [package for package in _packages() if f"`{package}`" not in text]
    assert not missing, f"docs/architecture.md does not name: {', '.join(missing)}"


def test_the_packages_are_found():
    assert {"webbuild/", "webbuild/pipeline/", "webbuild/tools/verify/", "webbuild/template/"} <= set(_packages())


def test_ci_workflow_runs_webbuild_commands_that_exist():
    from webbuild.tools.browser import CHANNELS

    workflow = yaml.safe_load(re.search(r"```yaml\n(.*?)```", CI.read_text(), re.S).group(1))
    jobs = workflow["jobs"]
    assert list(jobs) == ["build", "deploy", "verify"] and jobs["verify"]["needs"] == ["build", "deploy"]
    runs = [step.get("run", "") for job in jobs.values() for step in job["steps"]]
    lines = [line.strip() for run in runs for line in run.splitlines()]
    commands = [parse_command(line) for line in lines if line.startswith("webbuild ")]
    assert [name for name, _ in commands] == ["build", "verify"]
    (_, build), (_, verify) = commands
    assert (REPO / build["config"]).is_file()
    # the deployed URL, in Playwright's own Chromium
    assert verify["target"] == "$URL" and verify["browser"] in CHANNELS and verify["junit"]

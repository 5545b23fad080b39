"""docs/architecture.md names every package of webbuild/ (every folder with an __init__.py) and the
site template, so that the map of the house cannot fall behind a new package."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO / "docs" / "architecture.md"


def _packages() -> list[str]:
    folders = [p.parent for p in (REPO / "webbuild").rglob("__init__.py")] + [REPO / "webbuild" / "template"]
    return sorted(f"{folder.relative_to(REPO).as_posix()}/" for folder in folders)


def test_every_package_is_named_in_the_architecture_page():
    text = ARCHITECTURE.read_text()
    missing = [package for package in _packages() if f"`{package}`" not in text]
    assert not missing, f"docs/architecture.md does not name: {', '.join(missing)}"


def test_the_packages_are_found():
    assert {"webbuild/", "webbuild/build/", "webbuild/tools/verify/", "webbuild/template/"} <= set(_packages())

"""Shared fixtures: zoo exports of the tiny preset, made once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_model():
    from webbuild.zoo.build import random_model

    return random_model("tiny", seed=0)


@pytest.fixture(scope="session")
def zoo_export(tiny_model, tmp_path_factory):
    """zoo_export(layout, exporter) -> folder of that export of the same random tiny model."""
    from webbuild.zoo.export import export_model

    made: dict[tuple[str, str], Path] = {}

    def get(layout: str = "qwen3-asr-split", exporter: str = "torchscript") -> Path:
        if (layout, exporter) not in made:
            out = tmp_path_factory.mktemp("zoo") / f"{layout}-{exporter}"
            export_model(*tiny_model, out, layout, exporter)
            made[layout, exporter] = out
        return made[layout, exporter]

    return get

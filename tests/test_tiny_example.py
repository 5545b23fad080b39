"""The embedded example model really transcribes its sample clips (Python reference)."""

from __future__ import annotations

import pytest

from pipeline.audio import read_wav
from pipeline.config import load_config
from pipeline.transcribe import load_transcriber
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "tiny-asr"


@pytest.fixture(scope="module")
def example():
    cfg = load_config(EXAMPLE / "model.yaml")
    return cfg, load_transcriber(cfg.source.dir)


def test_example_config_names_its_samples(example):
    cfg, _ = example
    assert len(cfg.site.samples) >= 3
    for sample in cfg.site.samples:
        assert sample.audio.with_suffix(".txt").read_text().strip() == sample.text


def test_samples_transcribe_exactly(example):
    cfg, runner = example
    for sample in cfg.site.samples:
        assert runner.transcribe(read_wav(sample.audio)) == sample.text


def test_example_stays_small():
    size = sum(p.stat().st_size for p in EXAMPLE.rglob("*") if p.is_file())
    assert size < 30 * 1024 * 1024

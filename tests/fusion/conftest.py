"""The fusion tests' sources: every layout and exporter of the zoo (the zoo fixture of tests/conftest.py,
cached across sessions), each fused once a session; the onnxruntime-genai builder's graphs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SOURCES = [(layout, exporter) for exporter in ("torchscript", "dynamo") for layout in ("qwen3-asr-split", "merged")]
SOURCE_IDS = [f"{layout}-{exporter}" for layout, exporter in SOURCES]


@pytest.fixture(scope="session", params=SOURCES, ids=SOURCE_IDS)
def source(request, zoo) -> tuple[str, str, Path]:
    layout, exporter = request.param
    return layout, exporter, zoo.source(layout, exporter)


@pytest.fixture(scope="session")
def fused(source, tmp_path_factory):
    """(layout, exporter, source path, fused model, report, saved decoder.onnx path) per zoo source."""
    from webbuild.fusion.fuse_decoder import fuse_decoder, save

    layout, exporter, path = source
    model, report = fuse_decoder(path)
    out = save(model, tmp_path_factory.mktemp(f"fused-{layout}-{exporter}"))
    return layout, exporter, path, model, report, out


@pytest.fixture(scope="session")
def genai_build(zoo, tmp_path_factory):
    """genai_build(ep) -> the onnxruntime-genai builder's model.onnx for the zoo's weights (fp32, embeddings
    excluded) for that execution provider, built once a session."""
    pytest.importorskip("onnxruntime_genai")
    made: dict[str, Path] = {}

    def get(ep: str) -> Path:
        if ep not in made:
            out = tmp_path_factory.mktemp(f"genai-{ep}")
            subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(zoo.hf()),
                            "-o", str(out), "-p", "fp32", "-e", ep, "-c", str(out / "cache"),
                            "--extra_options", "exclude_embeds=true", "prune_lm_head=true"],
                           check=True, capture_output=True)
            made[ep] = out / "model.onnx"
        return made[ep]

    return get

"""Zoo exports shared by the fusion tests, built once and cached across sessions.

The cache key hashes the zoo's source and the torch/transformers versions, so a change to the
exporters rebuilds the fixtures instead of testing stale graphs. Dynamo exports (~40 s each) are
only built when a test asks for them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

ZOO_DIR = Path(__file__).resolve().parents[2] / "webbuild" / "zoo"
SOURCES = [(layout, exporter) for exporter in ("torchscript", "dynamo") for layout in ("qwen3-asr-split", "merged")]
SOURCE_IDS = [f"{layout}-{exporter}" for layout, exporter in SOURCES]


def _key() -> str:
    import torch
    import transformers

    h = hashlib.sha256(f"{torch.__version__} {transformers.__version__}".encode())
    for f in sorted(ZOO_DIR.glob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


class Zoo:
    def __init__(self, root: Path):
        self.root = root
        self._model = None

    def model(self):
        if self._model is None:
            from webbuild.zoo.build import random_model

            self._model = random_model("tiny", seed=0)
        return self._model

    def export(self, layout: str, exporter: str) -> Path:
        """The export folder for (layout, exporter)."""
        from webbuild.zoo.export import export_model

        out = self.root / f"{layout}-{exporter}"
        if not out.exists():
            export_model(*self.model(), out, layout=layout, exporter=exporter)
        return out

    def source(self, layout: str, exporter: str) -> Path:
        """What fuse_decoder takes: the split folder, or the merged .onnx file."""
        out = self.export(layout, exporter)
        return out if layout == "qwen3-asr-split" else out / "decoder_model_merged.onnx"

    def family(self, name: str) -> Path:
        """A merged export of a tiny Llama / Qwen2 / Qwen3 CausalLM (fusion.tests.sources)."""
        from tests.fusion.sources import export_family

        out = self.root / f"family-{name}"
        if not out.exists():
            export_family(name, out)
        return out / "decoder_model_merged.onnx"

    def quantized(self, layout: str = "merged") -> Path:
        """A torchscript zoo export with int4 MatMulNBits (block 64) weights, as fuse_decoder takes it."""
        from webbuild.zoo.published_int4 import quantize_export

        out = self.root / f"{layout}-torchscript-q4"
        if not out.exists():
            # float activations: the fused graph's packed MatMulNBits and the source's three
            # would round int8 activations differently at accuracy level 4
            quantize_export(self.export(layout, "torchscript"), out, accuracy_level=0)
        return out if layout == "qwen3-asr-split" else out / "decoder_model_merged.onnx"

    def hf(self) -> Path:
        from webbuild.zoo.build import save_text_decoder_hf

        out = self.root / "hf"
        if not out.exists():
            save_text_decoder_hf(*self.model(), out)
        return out


@pytest.fixture(scope="session")
def zoo(request) -> Zoo:
    root = Path(request.config.cache.mkdir(f"fusion-zoo-{_key()}"))
    return Zoo(root)


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


def partly_fused(path: Path, rules):
    """Load + cleanup a zoo source and apply `rules` (callables (model, report)) in order."""
    from webbuild.fusion import cleanup
    from webbuild.fusion.fuse_decoder import load_source
    from webbuild.fusion.rule_report import Report
    from webbuild.graph.ir import dead_code_elimination

    model, _ = load_source(path)
    cleanup.apply(model)
    report = Report()
    for rule in rules:
        rule(model, report)
        dead_code_elimination(model)
    return model, report

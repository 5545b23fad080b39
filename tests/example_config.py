"""The embedded example's model.yaml as a dict with every path absolute, to build it from another folder."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "tiny-asr"


def example_config() -> dict:
    """examples/tiny-asr/model.yaml with source.dir, the samples' audio and the adapters' paths absolute."""
    cfg = yaml.safe_load((EXAMPLE / "model.yaml").read_text())
    cfg["source"]["dir"] = str(EXAMPLE / cfg["source"]["dir"])
    for s in cfg["site"]["samples"]:
        s["audio"] = str(EXAMPLE / s["audio"])
    for a in cfg.get("adapters", []):
        a["path"] = str(EXAMPLE / a["path"])
    return cfg


def write_example_config(folder: Path, **changes) -> Path:
    """folder/model.yaml: the example's configuration with `changes` (top-level keys) applied."""
    path = folder / "model.yaml"
    path.write_text(yaml.safe_dump(example_config() | changes))
    return path


def sample_text(index: int = 0) -> str:
    """What the example's sample `index` (model.yaml site.samples) says."""
    return example_config()["site"]["samples"][index]["text"]

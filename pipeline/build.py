"""Stage orchestration for `webbuild model.yaml`: build into a temporary folder, then move into place.

Each stage is a plain function `stage(ctx)` that reads and writes files under `ctx.stage_dir`; the
runner times it and records peak memory in the build report.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.config import BuildConfig
from pipeline.report import BuildReport, graph_census, peak_rss_bytes


@dataclass
class BuildContext:
    cfg: BuildConfig
    stage_dir: Path
    report: BuildReport
    progress: Callable[[str], None]
    state: dict = field(default_factory=dict)


def stage_source(ctx: BuildContext) -> None:
    """Copy the source export into the build and take its op census."""
    src = ctx.cfg.source.dir
    dest = ctx.stage_dir / "model"
    shutil.copytree(src, dest)
    for graph in sorted(dest.glob("*.onnx")):
        ctx.report.graphs[graph.stem] = graph_census(graph)
    ctx.state["model_dir"] = dest


STAGES: list[tuple[str, Callable[[BuildContext], None]]] = [
    ("source", stage_source),
]


def run_build(cfg: BuildConfig, output: Path, progress: Callable[[str], None]) -> BuildReport:
    """Run every stage; `output` is replaced only when all of them succeed."""
    output = Path(output).resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    report = BuildReport(name=cfg.name)
    with tempfile.TemporaryDirectory(prefix=f".{output.name}-", dir=output.parent) as tmp:
        ctx = BuildContext(cfg, Path(tmp) / "site", report, progress)
        ctx.stage_dir.mkdir()
        for name, stage in STAGES:
            progress(f"stage {name}")
            start = time.monotonic()
            stage(ctx)
            report.add_stage(name, time.monotonic() - start, peak_rss_bytes())
        report.measure_files(ctx.stage_dir)
        report.write(ctx.stage_dir / "build-report.json")
        _replace(output, ctx.stage_dir)
    progress(f"wrote {output}")
    return report


def _replace(output: Path, built: Path) -> None:
    """Swap the finished build in; the old output is removed only after the new one is complete."""
    old = None
    if output.exists():
        old = output.with_name(f".{output.name}-old-{os.getpid()}")
        output.rename(old)
    built.rename(output)
    if old is not None:
        shutil.rmtree(old)

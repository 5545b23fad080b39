"""`webbuild model.yaml`: run the stages (webbuild.pipeline.stages) in a temporary folder, then move the site
into place. Each stage is timed and its peak memory recorded in the build report."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from webbuild.config import BuildConfig
from webbuild.errors import BuildError, WebbuildError
from webbuild.layouts import layout
from webbuild.pipeline.build_report import BuildReport, peak_rss_bytes
from webbuild.pipeline.stages import STAGES
from webbuild.pipeline.state import BuildContext, BuildState, SourceModel

log = logging.getLogger(__name__)


def run_build(cfg: BuildConfig, output: Path) -> BuildReport:
    """Run every stage; `output` is replaced only when all of them succeed."""
    output = Path(output).resolve()
    _check_replaceable(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    report = BuildReport(name=cfg.name)
    with tempfile.TemporaryDirectory(prefix=f".{output.name}-", dir=output.parent) as tmp:
        state = BuildState(SourceModel(cfg.source.dir, layout(cfg.source.layout)))
        ctx = BuildContext(cfg, Path(tmp) / "site", Path(tmp) / "work", report, state)
        ctx.stage_dir.mkdir()
        ctx.work_dir.mkdir()
        for name, stage in STAGES:
            log.info(f"stage {name}")
            start = time.monotonic()
            try:
                stage(ctx)
            except WebbuildError as exc:  # bad input, not a bug: say which stage found it
                error = BuildError(f"stage {name}: {exc.format_message()}")
                # a failed check (fusion.strict) stays exit code 1; click types exit_code a ClassVar, yet reads
                # it from the instance
                error.exit_code = exc.exit_code  # type: ignore[misc]
                raise error from exc
            report.add_stage(name, time.monotonic() - start, peak_rss_bytes())
        report.measure_files(ctx.stage_dir)
        assert state.manifest is not None, "the shard stage writes the manifest"
        report.files["shards"] = len(state.manifest["shards"])
        report.files["shard_limit_bytes"] = cfg.shard.max_bytes
        report.write(ctx.stage_dir / "build-report.json")
        _replace(output, ctx.stage_dir)
    log.info(f"wrote {output}")
    return report


def _check_replaceable(output: Path) -> None:
    """The output folder is replaced whole, so it must be new, empty or an earlier build (its
    build-report.json): `-o ~` must not delete a home folder."""
    if output.is_file():
        raise BuildError(f"{output} is a file; the output must be a folder (use -o to choose another)")
    if output.is_dir() and any(output.iterdir()) and not (output / "build-report.json").is_file():
        raise BuildError(f"{output} is not empty and holds no earlier build (no build-report.json), and the "
                         "output folder is replaced whole: choose a new or empty folder with -o")


def _replace(output: Path, built: Path) -> None:
    """Swap the finished build in; the old output is removed only after the new one is complete."""
    old = None
    if output.exists():
        old = output.with_name(f".{output.name}-old-{os.getpid()}")
        output.rename(old)
    built.rename(output)
    if old is not None:
        shutil.rmtree(old)

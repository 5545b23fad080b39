"""`webbuild model.yaml`: run the stages (webbuild.pipeline.stages) in a temporary folder, then publish the site
(webbuild.pipeline.publish). Each stage is timed and its peak memory recorded in the build report."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from webbuild.config import BuildConfig
from webbuild.errors import BuildError, WebbuildError
from webbuild.layouts import layout
from webbuild.pipeline.build_report import REPORT_NAME, BuildReport, peak_rss_bytes
from webbuild.pipeline.publish import making, output_lock, output_problem, publish, staging, user_files
from webbuild.pipeline.stages import STAGES
from webbuild.pipeline.state import BuildContext, BuildState, SourceModel

log = logging.getLogger(__name__)


def run_build(cfg: BuildConfig, output: Path) -> BuildReport:
    """Run every stage in a folder beside `output`, then publish it (webbuild.pipeline.publish): `output` is
    replaced only when all of them succeed, in one step, keeping the files the user put into it."""
    output = Path(output).resolve()
    _check_replaceable(output)
    with output_lock(output), staging(output) as tmp:
        with making(output, tmp):
            report = _run_stages(cfg, tmp)
        publish(tmp / "site", output, keep=user_files(output, _written(output)))
    log.info(f"wrote {output}")
    return report


def _run_stages(cfg: BuildConfig, tmp: Path) -> BuildReport:
    """Every stage, into `tmp`/site (the site) and `tmp`/work (scratch files); the report in the site."""
    report = BuildReport(name=cfg.name)
    state = BuildState(SourceModel(cfg.source.dir, layout(cfg.source.layout)))
    ctx = BuildContext(cfg, tmp / "site", tmp / "work", report, state)
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
    report.write(ctx.stage_dir / REPORT_NAME)
    return report


def _check_replaceable(output: Path) -> None:
    """The output folder is replaced whole, so it must be new, empty or an earlier build (its
    build-report.json): `-o ~` must not delete a home folder."""
    if problem := output_problem(output):
        raise BuildError(problem)
    if output.is_dir() and any(output.iterdir()) and not (output / REPORT_NAME).is_file():
        raise BuildError(f"{output} is not empty and holds no earlier build (no {REPORT_NAME}), and the "
                         "output folder is replaced whole: choose a new or empty folder with -o")


def _written(output: Path) -> list[str]:
    """What the build that made `output` wrote (its report's files.written); every other file there is the
    user's. An older report, without the list: every file but the static hosts' own at the top."""
    try:
        return list(json.loads((output / REPORT_NAME).read_text())["files"]["written"])
    except (OSError, ValueError, KeyError, TypeError):
        return [name for p in output.rglob("*") if p.is_file()
                and (name := p.relative_to(output).as_posix()) not in _HOST_FILES]


# what GitHub Pages and other static hosts read besides the site (README.md, Hosting)
_HOST_FILES = ("CNAME", ".nojekyll", "_redirects", "robots.txt")

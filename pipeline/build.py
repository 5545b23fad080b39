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

from pipeline.assemble import AssembleError, assemble_model
from pipeline.config import BuildConfig, ConfigError
from pipeline.manifest import dist_file_stats
from pipeline.render import ORT_WASM, RenderError, ort_dist, render_site
from pipeline.report import BuildReport, graph_census, peak_rss_bytes
from pipeline.shard import ShardError, shard_files


@dataclass
class BuildContext:
    cfg: BuildConfig
    stage_dir: Path
    report: BuildReport
    progress: Callable[[str], None]
    work_dir: Path  # scratch space beside the site: model files never land in dist/ unsharded
    state: dict = field(default_factory=dict)


def stage_source(ctx: BuildContext) -> None:
    """Copy the source export into the build and take its op census."""
    src = ctx.cfg.source.dir
    dest = ctx.work_dir / "source"
    shutil.copytree(src, dest)
    for graph in sorted(dest.glob("*.onnx")):
        ctx.report.graphs[graph.stem] = graph_census(graph)
    ctx.state["model_dir"] = dest


def stage_fuse(ctx: BuildContext) -> None:
    """One decoder graph with fused operators (fusion.cli.run_fuse) for the assemble stage.

    Split sources always need it (it also merges decoder_init + decoder_step); merged sources
    only when `fusion.enabled`.
    """
    cfg, src = ctx.cfg, ctx.state["model_dir"]
    if cfg.source.layout == "merged" and not cfg.fusion.enabled:
        return
    from fusion.cli import run_fuse

    out = ctx.work_dir / "fused"
    quiet = lambda line: ctx.progress(line) if line.startswith(("not fused", "wrote")) else None  # noqa: E731
    rep = run_fuse(src if cfg.source.layout != "merged" else src / "decoder_model_merged.onnx", out, progress=quiet)
    ctx.report.graphs["decoder"] = {k: rep[k] for k in ("nodes_before", "nodes_after", "ops_before", "ops_after")
                                    if k in rep}
    ctx.state["decoder"] = out / "decoder.onnx"


def stage_assemble(ctx: BuildContext) -> None:
    """The runtime's model files (pipeline.assemble); a fuse stage may set ctx.state['decoder']."""
    out = ctx.work_dir / "model"
    # TODO(quantize): a quantize stage after this one replaces ctx.state["variants"]
    # (assemble.quantized_variants turns its report into the variants the shard stage packs)
    ctx.state["variants"] = assemble_model(ctx.state["model_dir"], ctx.cfg.source.layout, out,
                                           decoder=ctx.state.get("decoder"))
    ctx.state["assembled"] = out
    missing = [v for v in ctx.cfg.variants if v not in ctx.state["variants"]]
    if missing:  # quantization makes fp16; until then the site offers what exists
        ctx.progress(f"variants {', '.join(missing)} not built yet (quantize stage); site gets "
                     f"{', '.join(ctx.state['variants'])}")


def stage_shard(ctx: BuildContext) -> None:
    """Every model file and ORT's wasm binary -> content-hashed shards under dist/model/."""
    model = ctx.state["assembled"]
    variants = ctx.state["variants"]
    files = {name: v["dir"] / name for v in variants.values() for name in v["files"].values()}
    files |= {"runtime.json": model / "runtime.json", "tokens.bin": model / "tokens.bin",
              ORT_WASM: ort_dist() / ORT_WASM}
    # the runtime finds each file by role (encoder, decoder_data, ...) in the variant entry
    entries = {name: {"files": list(v["files"].values()), "requires": VARIANT_REQUIRES[name],
                      "dtype": v["dtype"], **v["files"]} for name, v in variants.items()}
    manifest = shard_files(files, ctx.stage_dir / "model", model_id=ctx.cfg.name,
                           max_bytes=ctx.cfg.shard.max_bytes, variants=entries)
    ctx.state["manifest"] = manifest
    for name, v in variants.items():
        ctx.report.variants[name] = {f: manifest["files"][f]["size"] for f in v["files"].values()}


def stage_render(ctx: BuildContext) -> None:
    for warning in render_site(ctx.cfg, ctx.stage_dir, {"variants": list(ctx.state["variants"])}):
        ctx.progress(f"warning: {warning}")
    stats = dist_file_stats(ctx.stage_dir, ctx.cfg.shard.max_bytes)
    if stats["oversize_files"]:
        raise BuildError(f"files over shard.max_bytes ({ctx.cfg.shard.max_bytes}): "
                         f"{', '.join(stats['oversize_files'])}")


VARIANT_REQUIRES = {"fp16": ["shader-f16"], "fp32": []}

STAGES: list[tuple[str, Callable[[BuildContext], None]]] = [
    ("source", stage_source),
    ("fuse", stage_fuse),
    ("assemble", stage_assemble),
    ("shard", stage_shard),
    ("render", stage_render),
]


class BuildError(ValueError):
    """A stage found a problem with the build's output; the message says which files."""


STAGE_ERRORS = (AssembleError, RenderError, ShardError, BuildError)


def run_build(cfg: BuildConfig, output: Path, progress: Callable[[str], None]) -> BuildReport:
    """Run every stage; `output` is replaced only when all of them succeed."""
    output = Path(output).resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    report = BuildReport(name=cfg.name)
    with tempfile.TemporaryDirectory(prefix=f".{output.name}-", dir=output.parent) as tmp:
        ctx = BuildContext(cfg, Path(tmp) / "site", report, progress, Path(tmp) / "work")
        ctx.stage_dir.mkdir()
        ctx.work_dir.mkdir()
        for name, stage in STAGES:
            progress(f"stage {name}")
            start = time.monotonic()
            try:
                stage(ctx)
            except STAGE_ERRORS as exc:  # bad input, not a bug: one line and exit code 2 from the CLI
                raise ConfigError([f"stage {name}: {exc}"]) from exc
            report.add_stage(name, time.monotonic() - start, peak_rss_bytes())
        report.measure_files(ctx.stage_dir)
        report.files["shards"] = len(ctx.state["manifest"]["shards"])
        report.files["shard_limit_bytes"] = cfg.shard.max_bytes
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

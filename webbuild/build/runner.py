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

from webbuild.build.assemble import AssembleError, assemble_model
from webbuild.config import BuildConfig, ConfigError
from webbuild.site.contract import ORT_WASM, RUNTIME_FILE, TOKENS_FILE
from webbuild.site.manifest import dist_file_stats
from webbuild.build.render import RenderError, ort_dist, render_site
from webbuild.build.report import BuildReport, graph_census, peak_rss_bytes
from webbuild.build.shard import ShardError, shard_files
from webbuild.quantize.wasm_twin import WasmTwinError


@dataclass
class BuildContext:
    cfg: BuildConfig
    stage_dir: Path
    report: BuildReport
    progress: Callable[[str], None]
    work_dir: Path  # scratch space beside the site: model files never land in dist/ unsharded
    state: dict = field(default_factory=dict)


def stage_source(ctx: BuildContext) -> None:
    """Take the source export's op census. Later stages read the source in place (they never write
    to it), so a multi-GB export is not copied."""
    src = ctx.cfg.source.dir
    for graph in sorted(src.glob("*.onnx")):
        ctx.report.graphs[graph.stem] = graph_census(graph)
    ctx.state["model_dir"] = src


def stage_fuse(ctx: BuildContext) -> None:
    """One decoder graph and the encoder with fused operators (fusion.cli.run_fuse) for the assemble stage.

    Split sources always need it (it also merges decoder_init + decoder_step); merged sources
    only when `fusion.enabled`.
    """
    cfg, src = ctx.cfg, ctx.state["model_dir"]
    if cfg.source.layout == "merged" and not cfg.fusion.enabled:
        return
    from webbuild.build.fuse import run_fuse

    out = ctx.work_dir / "fused"
    quiet = lambda line: ctx.progress(line) if line.startswith(("not fused", "wrote")) else None  # noqa: E731
    # quantize=False: the quantize stage quantizes (with model.yaml's settings), after assemble
    rep = run_fuse(src if cfg.source.layout != "merged" else src / "decoder_model_merged.onnx", out, progress=quiet,
                   quantize=False, pack_qkv=cfg.fusion.pack_qkv, prune_lm_head=cfg.fusion.prune_lm_head)
    census = ("nodes_before", "nodes_after", "ops_before", "ops_after")
    ctx.report.graphs["decoder"] = {k: rep[k] for k in census if k in rep}
    ctx.state["decoder"] = out / "decoder.onnx"
    if "encoder" in rep:  # fused before quantization; assemble puts the mel front-end in front
        ctx.report.graphs["encoder"] = {k: rep["encoder"][k] for k in census}
        ctx.state["encoder"] = out / "encoder.onnx"


def stage_assemble(ctx: BuildContext) -> None:
    """The runtime's model files (webbuild.build.assemble); a fuse stage may set ctx.state['decoder'] / ['encoder']."""
    out = ctx.work_dir / "model"
    ctx.state["variants"] = assemble_model(ctx.state["model_dir"], ctx.cfg.source.layout, out,
                                           decoder=ctx.state.get("decoder"), encoder=ctx.state.get("encoder"))
    ctx.state["assembled"] = out
    missing = [v for v in ctx.cfg.variants if v not in ctx.state["variants"]]
    if missing and ctx.cfg.quantize.method == "none":  # only the quantize stage makes fp16
        ctx.progress(f"variants {', '.join(missing)} need quantization (quantize.method is 'none'); "
                     f"site gets {', '.join(ctx.state['variants'])}")


def stage_quantize(ctx: BuildContext) -> None:
    """int4 MatMulNBits + int4 embedding lookup, written as the configured precision variants,
    each checked on the sample clips against the fp32 unfused source (webbuild.quantize)."""
    cfg = ctx.cfg
    if cfg.quantize.method == "none":
        return
    from webbuild.build.assemble import quantized_variants
    from webbuild.quantize.variants import quantize_variants

    out = ctx.work_dir / "quantized"
    rep = quantize_variants(ctx.state["assembled"], out, cfg.quantize, cfg.variants, cfg.encoder.precision)
    ctx.state["variants"] = quantized_variants(out, rep)
    ctx.report.quantize = {k: v for k, v in rep.items() if k != "variants"}
    for name, v in rep["variants"].items():
        ctx.report.variants[name] = {"decoder_bytes": v["decoder"]["bytes"], "encoder_bytes": v["encoder"]["bytes"],
                                     "decoder_ops": v["decoder"]["ops"]}
    _check_variants(ctx, out)


def _check_variants(ctx: BuildContext, out: Path) -> None:
    """Session creation and greedy transcripts of every variant; agreement with the source."""
    from webbuild.reference.audio import read_wav
    from webbuild.build.check import check_variant, reference_tokens, variant_transcriber

    clips = {s.audio.name: read_wav(s.audio) for s in ctx.cfg.site.samples}
    reference = reference_tokens(ctx.cfg.source.dir, clips) if clips else None
    for name in ctx.state["variants"]:
        runner = variant_transcriber(out, name, ctx.state["model_dir"])
        result = check_variant(runner, clips, reference)
        ctx.report.variants[name]["check"] = result
        agreement = result.get("mean_token_agreement")
        if agreement is not None:
            ctx.progress(f"variant {name}: token agreement with the fp32 source {agreement:.3f} "
                         f"on {len(clips)} sample clips")


def stage_shard(ctx: BuildContext) -> None:
    """Every model file and ORT's wasm binary -> content-hashed shards under dist/model/."""
    model = ctx.state["assembled"]
    variants = ctx.state["variants"]
    _webgpu_forms_and_wasm_twins(variants, ctx.report)
    files = {name: v["dir"] / name for v in variants.values() for name in v["files"].values()}
    files |= {RUNTIME_FILE: model / RUNTIME_FILE, TOKENS_FILE: model / TOKENS_FILE, ORT_WASM: ort_dist() / ORT_WASM}
    # the runtime finds each file by role (encoder, decoder_data, ...: webbuild.site.contract.FILE_ROLES)
    entries = {name: {"files": list(v["files"].values()), "requires": VARIANT_REQUIRES[name],
                      "dtype": v["dtype"], **v["files"]} for name, v in variants.items()}
    manifest = shard_files(files, ctx.stage_dir / "model", model_id=ctx.cfg.name,
                           max_bytes=ctx.cfg.shard.max_bytes, variants=entries)
    ctx.state["manifest"] = manifest
    for name, v in variants.items():
        ctx.report.variants.setdefault(name, {})["files"] = {
            f: manifest["files"][f]["size"] for f in v["files"].values()}


def _webgpu_forms_and_wasm_twins(variants: dict, report: BuildReport) -> None:
    """Every decoder becomes the WebGPU form (Q/K norms inside GroupQueryAttention); fp32 variants keep
    the form the wasm fallback runs as a twin graph (role decoder_wasm; same weights file, so it costs
    a few KB), and a quantized encoder gets one too (role encoder_wasm). See webbuild.build.forms and
    webbuild.quantize.wasm_twin. The report's decoder_ops then count the shipped graph."""
    from webbuild.build.forms import op_counts, webgpu_decoder
    from webbuild.quantize.wasm_twin import twin_name, wasm_graph

    for name, v in variants.items():
        dec, enc = v["files"].get("decoder"), v["files"].get("encoder")
        if dec and (twin := webgpu_decoder(v["dir"], dec, wasm_twin=v["dtype"] == "float32")):
            v["files"]["decoder_wasm"] = twin
        # the int4 encoder too: onnxruntime-web's wasm MatMulNBits is slow (webbuild.quantize.wasm_twin)
        if enc and v["dtype"] == "float32" and wasm_graph(v["dir"] / enc, v["dir"] / twin_name(enc)):
            v["files"]["encoder_wasm"] = twin_name(enc)
        if dec and name in report.variants:
            report.variants[name]["decoder_ops"] = op_counts(v["dir"] / dec)


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
    ("quantize", stage_quantize),
    ("shard", stage_shard),
    ("render", stage_render),
]


class BuildError(ValueError):
    """A stage found a problem with the build's output; the message says which files."""


STAGE_ERRORS = (AssembleError, RenderError, ShardError, BuildError, WasmTwinError)


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

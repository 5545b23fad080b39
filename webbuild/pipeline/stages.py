"""The build's stages, in order: plain functions `stage(ctx)` that read and write files under the context's
folders and hand their results on in `ctx.state` (webbuild.pipeline.state)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from webbuild.errors import BuildError, FusionIncomplete
from webbuild.forms.form import Report as FormsReport
from webbuild.forms.form import strict_failures as forms_strict_failures
from webbuild.forms.form import summary as forms_summary
from webbuild.graph.census import op_census
from webbuild.layouts import Table
from webbuild.pipeline.adapter_files import pack_adapters
from webbuild.pipeline.assemble import assemble_model, chunk_positions, present_files
from webbuild.pipeline.build_report import census
from webbuild.pipeline.forms import variant_forms
from webbuild.pipeline.render import copy_static, ort_dist, render_site, vad_dist
from webbuild.pipeline.sample_wer import report_wer, sample_wer
from webbuild.pipeline.shard import shard_files
from webbuild.pipeline.state import BuildContext, Variant
from webbuild.reference import source_v2
from webbuild.reference.chunk import ChunkPolicy
from webbuild.reference.mel import lead_samples
from webbuild.reference.source_files import check_source
from webbuild.reference.vad import DEFAULT_VAD, VAD_FILE
from webbuild.site.contract import ORT_WASM, RUNTIME_FILE, TOKENS_FILE
from webbuild.site.manifest import dist_file_stats

log = logging.getLogger(__name__)


def stage_source(ctx: BuildContext) -> None:
    """Check the source export's files (webbuild.reference.source_files; an int8-table source's table and
    graphs: source_v2), then take its op census. Later stages read the source in place (they never write
    to it), so a multi-GB export is not copied."""
    model = ctx.state.model
    cfg = check_source(model.dir, model.layout)
    if model.layout.table is Table.INT8_ROWS:
        source_v2.check_source(model.dir, cfg)
    for graph in sorted(ctx.state.model.dir.glob("*.onnx")):
        ctx.report.graphs[graph.stem] = {"source": census(op_census(graph))}


def stage_fuse(ctx: BuildContext) -> None:
    """One decoder graph and the encoder with fused operators (webbuild.pipeline.fuse.run_fuse) for the
    assemble stage.

    Split sources always need it (it also merges decoder_init + decoder_step); sources whose decoder
    has the build's interface already (webbuild.layouts: fusion_optional) only when `fusion.enabled`.
    """
    cfg, model = ctx.cfg, ctx.state.model
    if model.layout.fusion_optional and not cfg.fusion.enabled:
        return
    from webbuild.pipeline.fuse import check_growing_cache, check_strict, run_fuse

    out = ctx.work_dir / "fused"
    # quantize=False: the quantize stage quantizes (with model.yaml's settings), after assemble
    # GQA's cos/sin caches: the model's maximum positions, and never fewer than one chunk of long audio reaches
    rep = run_fuse(model.decoder_source, out, quantize=False, pack_qkv=cfg.fusion.pack_qkv,
                   prune_lm_head=cfg.fusion.prune_lm_head,
                   min_positions=chunk_positions(model.dir, chunk_policy(cfg.chunking)))
    check_growing_cache(rep, model.decoder_source)
    ctx.report.graphs["decoder"] = _fused_graph(rep)
    model.decoder = out / "decoder.onnx"
    if "encoder" in rep:  # fused before quantization; assemble puts the mel front-end in front
        ctx.report.graphs["encoder"] = _fused_graph(rep["encoder"])
        model.encoder = out / "encoder.onnx"
    if cfg.fusion.strict:
        check_strict(rep, "fusion.strict", with_summary=True)


def _fused_graph(rep: dict) -> dict:
    """A fusion report's censuses and what its rules left alone, as build-report.json names them; and how many
    nodes fusion put into topological order, where the source had any out of it."""
    graph = {"source": census(rep["ops_before"]), "fused": census(rep["ops_after"]), "not_fused": rep["not_fused"]}
    return graph | ({"sorted_nodes": rep["sorted_nodes"]} if rep.get("sorted_nodes") else {})


def chunk_policy(chunking) -> ChunkPolicy:
    """model.yaml's `chunking` as the runtime's policy (webbuild.reference.chunk)."""
    return ChunkPolicy(join_seconds=float("inf")).override(chunking.max_seconds, chunking.join_seconds)


def stage_assemble(ctx: BuildContext) -> None:
    """The runtime's model files (webbuild.pipeline.assemble), from the fuse stage's graphs where it ran."""
    state = ctx.state
    state.assembled = ctx.work_dir / "model"
    forms = FormsReport()
    fp32 = assemble_model(state.model.dir, state.model.layout, state.assembled, decoder=state.model.decoder,
                          encoder=state.model.encoder, lead=lead_samples(ctx.cfg.encoder.lead_ms),
                          chunking=chunk_policy(ctx.cfg.chunking), languages=tuple(ctx.cfg.languages),
                          language=ctx.cfg.language, context=ctx.cfg.context, forms=forms)
    record_forms(ctx, forms)
    if ctx.cfg.speech_detection:
        add_speech_detection(state.assembled)
    state.variants = {fp32.name: fp32}
    missing = [v for v in ctx.cfg.variants if v not in state.variants]
    if missing and ctx.cfg.quantize.method == "none":  # only the quantize stage makes fp16
        log.warning(f"variants {', '.join(missing)} need quantization (quantize.method is 'none'); "
                    f"site gets {', '.join(state.variants)}")


def add_speech_detection(assembled: Path) -> None:
    """runtime.json's `vad` (webbuild.reference.vad's policy); the model file joins the shards (stage_shard)."""
    path = assembled / RUNTIME_FILE
    path.write_text(json.dumps(json.loads(path.read_text()) | {"vad": DEFAULT_VAD.as_json()}, indent=1) + "\n")


def stage_quantize(ctx: BuildContext) -> None:
    """int4 MatMulNBits + int4 embedding lookup, written as the configured precision variants
    (webbuild.quantize); the check stage runs what ships of them."""
    cfg = ctx.cfg
    if cfg.quantize.method == "none":
        return
    from webbuild.quantize.variants import quantize_variants

    out = ctx.work_dir / "quantized"
    rep = quantize_variants(ctx.state.assembled_dir, out, cfg.quantize, cfg.variants, cfg.encoder.precision)
    ctx.state.variants = {name: _quantized_variant(out, name, v["encoder"]["file"], v["decoder"]["file"])
                          for name, v in rep["variants"].items()}
    ctx.report.quantize = {k: v for k, v in rep.items() if k != "variants"}
    for name, v in rep["variants"].items():
        ctx.report.variants[name] = {"decoder": {"bytes": v["decoder"]["bytes"]},
                                     "encoder": {"bytes": v["encoder"]["bytes"]}}


def _quantized_variant(folder: Path, name: str, encoder: str, decoder: str) -> Variant:
    """A variant the quantize stage wrote: both graphs and, where written, their weights files."""
    return Variant(name, folder, present_files(folder, {"encoder": encoder, "encoder_data": encoder + ".data",
                                                        "decoder": decoder, "decoder_data": decoder + ".data"}))


def stage_forms(ctx: BuildContext) -> None:
    """Every file each variant ships, written once into work/forms/ (webbuild.pipeline.forms): the WebGPU
    decoder (Q/K norms inside GroupQueryAttention, MatMulNBits at `quantize.webgpu_accuracy_level`) with its
    step form for graph capture, the fp32 variants' wasm twins in the forms their wasm plan chose
    (webbuild.pipeline.wasm_budget), the adapted decoder's forms in a build with adapters, and each
    adapter's packed file. The report's decoder census then counts the shipped graph."""
    plans = _wasm_plans(ctx)
    level = ctx.cfg.quantize.webgpu_accuracy_level if ctx.cfg.quantize.method != "none" else None
    dest = ctx.work_dir / "forms"
    dest.mkdir()
    forms = FormsReport()
    for name, v in list(ctx.state.variants.items()):
        wasm_forms = plans[name]["forms"] if name in plans else None  # none: the wasm EP never runs it
        shipped = ctx.state.variants[name] = variant_forms(v, dest, wasm_forms, level, bool(ctx.cfg.adapters),
                                                           forms, ctx.cfg.fusion.step_attention)
        log.debug(f"variant {name} ({shipped.dtype}): " + ", ".join(f"{r} {f}" for r, f in shipped.files.items()))
        if "decoder" in shipped.files:  # a float build (quantize.method none) has no quantize stage's row
            ctx.report.variants.setdefault(name, {}).setdefault("decoder", {}).update(
                census(op_census(shipped.path("decoder"))))
    record_forms(ctx, forms)
    ctx.state.wasm_plans = plans
    ctx.state.adapter_files, ctx.state.adapters = pack_adapters(ctx.cfg.adapters, ctx.state.assembled_dir,
                                                                ctx.work_dir / "adapters", ctx.report)


def record_forms(ctx: BuildContext, forms: FormsReport) -> None:
    """A stage's graph forms into the report's `forms`; with fusion.strict a form lost stops the build here
    (FusionIncomplete, exit code 1, every form not made listed), as an attention left unfused does."""
    ctx.report.forms["made"] += forms.made
    ctx.report.forms["not_made"] += forms.missed
    failures = forms_strict_failures(forms.as_dict())
    if failures and ctx.cfg.fusion.strict:
        raise FusionIncomplete("\n".join([f"{failures[0]} (fusion.strict)", *failures[1:],
                                           *forms_summary(forms.as_dict())]))


def stage_check(ctx: BuildContext) -> None:
    """Every graph each variant ships, run on onnxruntime CPU on the sample clips against the unfused
    source (webbuild.pipeline.check): a row per role in the report's `variants.<variant>.check.roles`."""
    from webbuild.pipeline.check import RoleCheck, reference_tokens
    from webbuild.reference.audio import read_wav

    clips = {s.audio.name: read_wav(s.audio) for s in ctx.cfg.site.samples}
    # a source encoder taking mel gets the lead the built front-end puts first (one taking pcm, its own)
    reference = reference_tokens(ctx.state.model.dir, clips, lead=lead_samples(ctx.cfg.encoder.lead_ms)) \
        if clips else None
    runtime = json.loads((ctx.state.assembled_dir / RUNTIME_FILE).read_text())
    rank = next(iter(ctx.state.adapters.values()))["rank"] if ctx.state.adapters else None
    side = ctx.state.model.dir  # config.json and tokenizer.json
    for name, v in ctx.state.variants.items():
        rows = RoleCheck(v, side, ctx.work_dir / "check" / name, clips, reference, runtime["max_positions"],
                         rank).rows()
        check = ctx.report.variants.setdefault(name, {})["check"] = {"roles": rows}
        if "mean_token_agreement" in rows.get("decoder", {}):  # the WebGPU path's, as the report has said
            check |= {k: rows["decoder"][k] for k in ("transcripts", "token_agreement", "mean_token_agreement")}
        log.info(f"variant {name}: " + "; ".join(_check_text(role, row) for role, row in rows.items()))
        check["samples"] = sample_wer(ctx.cfg.site.samples, rows.get("decoder", {}).get("transcripts", {}))
        report_wer(name, check["samples"], ctx.cfg.verify.max_wer, ctx.cfg.verify.build_fails_on_wer)
        if broken := [role for role, row in rows.items()
                      if False in (row.get("tokens_equal"), row.get("values_equal"))]:
            # the forms stage's own output is wrong: a bug, not bad input, so not a WebbuildError
            raise RuntimeError(f"variant {name}: {', '.join(broken)} disagree with what they must equal: "
                               + "; ".join(_check_text(role, rows[role]) for role in broken))


def _check_text(role: str, row: dict) -> str:
    if "tokens_equal" in row or "values_equal" in row:
        equal = False not in (row.get("tokens_equal"), row.get("values_equal"))
        return f"{role} {'equal to' if equal else 'DIFFERS from'} {row['against']}" \
            + "".join(f" ({p})" for p in row.get("problems", [])[:2])
    agreement = row.get("mean_token_agreement")
    return f"{role} {agreement:.3f}" if agreement is not None else f"{role} opened"


def stage_shard(ctx: BuildContext) -> None:
    """Every shipped file, runtime.json, tokens.bin and ORT's wasm binary -> content-hashed shards under
    dist/model/, with the manifest (webbuild.pipeline.shard)."""
    assembled, variants = ctx.state.assembled_dir, ctx.state.variants
    files = {name: v.dir / name for v in variants.values() for name in v.files.values()}
    files |= {RUNTIME_FILE: assembled / RUNTIME_FILE, TOKENS_FILE: assembled / TOKENS_FILE,
              ORT_WASM: ort_dist() / ORT_WASM}
    if ctx.cfg.speech_detection:  # Silero VAD's model, package data at its locked version (ort_files.vad_dir)
        files[VAD_FILE] = vad_dist() / VAD_FILE
    # the runtime finds each file by role (encoder, decoder_data, ...: webbuild.site.contract.FILE_ROLES)
    entries: dict[str, dict] = {
        name: {"files": list(v.files.values()), "requires": v.requires, "dtype": v.dtype, **v.files,
               "providers": v.providers} for name, v in variants.items()}
    for name, fit in ctx.state.wasm_plans.items():
        entries[name]["wasm"] = {k: fit[k] for k in ("need_bytes", "budget_bytes", "fits", "tab_bytes")}
    for name, v in variants.items():
        if v.lora_layout:
            entries[name]["lora_layout"] = v.lora_layout
        if v.weights:
            entries[name]["weights"] = v.weights
    manifest = shard_files(files | ctx.state.adapter_files, ctx.stage_dir / "model", model_id=ctx.cfg.name,
                           max_bytes=ctx.cfg.shard.max_bytes, variants=entries, adapters=ctx.state.adapters)
    ctx.state.manifest = manifest
    for name, v in variants.items():
        ctx.report.variants.setdefault(name, {})["files"] = {f: manifest["files"][f]["size"] for f in v.files.values()}


def _wasm_plans(ctx: BuildContext) -> dict[str, dict]:
    """The fp32 variants' wasm plans (webbuild.pipeline.wasm_budget): each graph's form for the wasm EP and
    the memory estimate of every option, into the report; the page reads `fits` from the manifest entry
    and says the model needs WebGPU where it is false (no option fits)."""
    from webbuild.pipeline.wasm_budget import GIB, variant_plan

    runtime = json.loads((ctx.state.assembled_dir / RUNTIME_FILE).read_text())
    plans = {}
    for name, v in ctx.state.variants.items():
        if "wasm" not in v.providers:
            continue  # a variant the wasm EP never runs (webbuild.site.contract.VARIANTS)
        fit = plans[name] = variant_plan(v.dir, v.files, runtime, decoder_sessions=2 if ctx.cfg.adapters else 1)
        ctx.report.variants.setdefault(name, {})["wasm"] = fit
        options = "; ".join(f"{_forms_text(o['forms'])}: {o['need_bytes'] / GIB:.2f} GiB" for o in fit["options"])
        if fit["fits"]:
            derived = f"; {fit['int8_bytes'] / GIB:.2f} GiB of int8 weights derived at load from the int4 ones, " \
                "nothing more to download" if fit["int8_bytes"] else ""
            log.info(f"{name}: wasm fallback needs about {fit['need_bytes'] / GIB:.2f} GiB of "
                     f"{fit['budget_bytes'] / GIB:.2f} GiB, the tab at most {fit['tab_bytes'] / GIB:.2f} GiB "
                     f"({_forms_text(fit['forms'])}{derived}; options: {options})")
        else:
            log.warning(f"{name}: no wasm fallback: needs {fit['need_bytes'] / GIB:.1f} GiB of the "
                        f"{fit['budget_bytes'] / GIB:.1f} GiB a wasm page gets; visitors without WebGPU "
                        f"are told the model needs WebGPU (options: {options})")
    return plans


def _forms_text(forms: dict[str, str]) -> str:
    return ", ".join(f"{graph} {form}" for graph, form in forms.items())


def stage_render(ctx: BuildContext) -> None:
    """The page, its runtime and onnxruntime-web's files (webbuild.pipeline.render), then site.static's files;
    no file over shard.max_bytes."""
    for warning in render_site(ctx.cfg, ctx.stage_dir, {"variants": list(ctx.state.variants)}):
        log.warning(warning)
    if ctx.cfg.site.static is not None:
        copy_static(ctx.cfg.site.static, ctx.stage_dir)
    stats = dist_file_stats(ctx.stage_dir, ctx.cfg.shard.max_bytes)
    if stats["oversize_files"]:
        raise BuildError(f"files over shard.max_bytes ({ctx.cfg.shard.max_bytes}): "
                         f"{', '.join(stats['oversize_files'])}")


STAGES: list[tuple[str, Callable[[BuildContext], None]]] = [
    ("source", stage_source),
    ("fuse", stage_fuse),
    ("assemble", stage_assemble),
    ("quantize", stage_quantize),
    ("forms", stage_forms),
    ("check", stage_check),
    ("shard", stage_shard),
    ("render", stage_render),
]

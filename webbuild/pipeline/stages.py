"""The build's stages, in order: plain functions `stage(ctx)` that read and write files under the context's
folders and hand their results on in `ctx.state` (webbuild.pipeline.state)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from webbuild.errors import BuildError
from webbuild.graph.census import op_census
from webbuild.pipeline.assemble import assemble_model, present_files
from webbuild.pipeline.build_report import census
from webbuild.pipeline.render import ort_dist, render_site
from webbuild.pipeline.shard import shard_files
from webbuild.pipeline.state import BuildContext, Variant
from webbuild.reference import source_v2
from webbuild.reference.mel import lead_samples
from webbuild.site.contract import ORT_WASM, RUNTIME_FILE, TOKENS_FILE
from webbuild.site.manifest import dist_file_stats
from webbuild.text import plural, size

log = logging.getLogger(__name__)


def stage_source(ctx: BuildContext) -> None:
    """Take the source export's op census. Later stages read the source in place (they never write
    to it), so a multi-GB export is not copied. A v2 source's interface and table are checked first."""
    model = ctx.state.model
    if model.layout == "qwen3-asr-v2":
        source_v2.check_source(model.dir, json.loads((model.dir / "config.json").read_text()))
    for graph in sorted(ctx.state.model.dir.glob("*.onnx")):
        ctx.report.graphs[graph.stem] = {"source": census(op_census(graph))}


def stage_fuse(ctx: BuildContext) -> None:
    """One decoder graph and the encoder with fused operators (webbuild.pipeline.fuse.run_fuse) for the
    assemble stage.

    Split sources always need it (it also merges decoder_init + decoder_step); merged sources
    only when `fusion.enabled`.
    """
    cfg, model = ctx.cfg, ctx.state.model
    if model.layout == "merged" and not cfg.fusion.enabled:
        return
    from webbuild.pipeline.fuse import check_strict, run_fuse

    out = ctx.work_dir / "fused"
    # quantize=False: the quantize stage quantizes (with model.yaml's settings), after assemble
    rep = run_fuse(model.decoder_source, out, quantize=False, pack_qkv=cfg.fusion.pack_qkv,
                   prune_lm_head=cfg.fusion.prune_lm_head)
    ctx.report.graphs["decoder"] = _fused_graph(rep)
    model.decoder = out / "decoder.onnx"
    if "encoder" in rep:  # fused before quantization; assemble puts the mel front-end in front
        ctx.report.graphs["encoder"] = _fused_graph(rep["encoder"])
        model.encoder = out / "encoder.onnx"
    if cfg.fusion.strict:
        check_strict(rep, "fusion.strict", with_summary=True)


def _fused_graph(rep: dict) -> dict:
    """A fusion report's censuses and what its rules left alone, as build-report.json names them."""
    return {"source": census(rep["ops_before"]), "fused": census(rep["ops_after"]), "not_fused": rep["not_fused"]}


def stage_assemble(ctx: BuildContext) -> None:
    """The runtime's model files (webbuild.pipeline.assemble), from the fuse stage's graphs where it ran."""
    state = ctx.state
    state.assembled = ctx.work_dir / "model"
    fp32 = assemble_model(state.model.dir, state.model.layout, state.assembled, decoder=state.model.decoder,
                          encoder=state.model.encoder, lead=lead_samples(ctx.cfg.encoder.lead_ms))
    state.variants = {fp32.name: fp32}
    missing = [v for v in ctx.cfg.variants if v not in state.variants]
    if missing and ctx.cfg.quantize.method == "none":  # only the quantize stage makes fp16
        log.warning(f"variants {', '.join(missing)} need quantization (quantize.method is 'none'); "
                    f"site gets {', '.join(state.variants)}")


def stage_quantize(ctx: BuildContext) -> None:
    """int4 MatMulNBits + int4 embedding lookup, written as the configured precision variants,
    each checked on the sample clips against the fp32 unfused source (webbuild.quantize)."""
    cfg = ctx.cfg
    if cfg.quantize.method == "none":
        return
    from webbuild.quantize.variants import quantize_variants

    out = ctx.work_dir / "quantized"
    rep = quantize_variants(ctx.state.assembled, out, cfg.quantize, cfg.variants, cfg.encoder.precision)
    ctx.state.variants = {name: _quantized_variant(out, name, v["encoder"]["file"], v["decoder"]["file"])
                          for name, v in rep["variants"].items()}
    ctx.report.quantize = {k: v for k, v in rep.items() if k != "variants"}
    for name, v in rep["variants"].items():
        ctx.report.variants[name] = {"decoder": {"bytes": v["decoder"]["bytes"]},
                                     "encoder": {"bytes": v["encoder"]["bytes"]}}
    _check_variants(ctx, out)


def _quantized_variant(folder: Path, name: str, encoder: str, decoder: str) -> Variant:
    """A variant the quantize stage wrote: both graphs and, where written, their weights files."""
    return Variant(name, folder, present_files(folder, {"encoder": encoder, "encoder_data": encoder + ".data",
                                                        "decoder": decoder, "decoder_data": decoder + ".data"}))


def _check_variants(ctx: BuildContext, out: Path) -> None:
    """Session creation and greedy transcripts of every variant; agreement with the source."""
    from webbuild.pipeline.check import check_variant, reference_tokens, variant_transcriber
    from webbuild.reference.audio import read_wav

    clips = {s.audio.name: read_wav(s.audio) for s in ctx.cfg.site.samples}
    # a source encoder taking mel gets the lead the built front-end puts first (one taking pcm, its own)
    reference = reference_tokens(ctx.state.model.dir, clips, lead=lead_samples(ctx.cfg.encoder.lead_ms)) \
        if clips else None
    for name in ctx.state.variants:
        runner = variant_transcriber(out, name, ctx.state.model.dir)
        result = check_variant(runner, clips, reference)
        ctx.report.variants[name]["check"] = result
        agreement = result.get("mean_token_agreement")
        if agreement is not None:
            log.info(f"variant {name}: token agreement with the fp32 source {agreement:.3f} "
                     f"on {plural(len(clips), 'sample clip')}")


def stage_shard(ctx: BuildContext) -> None:
    """Every model file and ORT's wasm binary -> content-hashed shards under dist/model/."""
    assembled, variants = ctx.state.assembled, ctx.state.variants
    plans = _wasm_plans(ctx)
    _webgpu_forms_and_wasm_twins(ctx, plans)
    for v in variants.values():
        log.debug(f"variant {v.name} ({v.dtype}): " + ", ".join(f"{role} {f}" for role, f in v.files.items()))
    files = {name: v.dir / name for v in variants.values() for name in v.files.values()}
    files |= {RUNTIME_FILE: assembled / RUNTIME_FILE, TOKENS_FILE: assembled / TOKENS_FILE,
              ORT_WASM: ort_dist() / ORT_WASM}
    adapter_files, adapters = _packed_adapters(ctx)
    # the runtime finds each file by role (encoder, decoder_data, ...: webbuild.site.contract.FILE_ROLES)
    entries = {name: {"files": list(v.files.values()), "requires": v.requires, "dtype": v.dtype, **v.files,
                      "providers": v.providers} for name, v in variants.items()}
    for name, fit in plans.items():
        entries[name]["wasm"] = {k: fit[k] for k in ("need_bytes", "budget_bytes", "fits")}
    manifest = shard_files(files | adapter_files, ctx.stage_dir / "model", model_id=ctx.cfg.name,
                           max_bytes=ctx.cfg.shard.max_bytes, variants=entries, adapters=adapters)
    ctx.state.manifest = manifest
    for name, v in variants.items():
        ctx.report.variants.setdefault(name, {})["files"] = {f: manifest["files"][f]["size"] for f in v.files.values()}


def _packed_adapters(ctx: BuildContext) -> tuple[dict[str, Path], dict[str, dict]]:
    """Each model.yaml adapter as its own file of the adapted decoder's lora.* inputs
    (webbuild.site.adapter_pack, docs/adapters.md), and its manifest entry; the report gets each
    file's size against the adapter's rank-32 int8 size (one byte per parameter)."""
    from webbuild.site.adapter_pack import graph_inputs, pack

    layers = json.loads((ctx.state.assembled / RUNTIME_FILE).read_text())["decoder"]["num_layers"]
    folder = ctx.work_dir / "adapters"
    folder.mkdir(exist_ok=True)
    files, entries = {}, {}
    for a in ctx.cfg.adapters:
        inputs = graph_inputs(a.path, layers, a.scale)
        data, tensors = pack(inputs, a.precision)
        name = f"adapter.{a.name}.bin"
        (folder / name).write_bytes(data)
        files[name] = folder / name
        rank = next(iter(inputs.values())).shape[1]
        entries[a.name] = {"file": name, "precision": a.precision, "rank": rank, "scale": a.scale,
                           "bytes": len(data), "tensors": tensors}
        parameters = sum(w.size for w in inputs.values())
        ctx.report.adapters[a.name] = {"bytes": len(data), "parameters": parameters,
                                       "int8_ratio": round(len(data) / parameters, 4)}
        log.info(f"adapter {a.name}: {size(len(data))} ({a.precision}, {parameters:,} parameters, "
                 f"{len(data) / parameters:.3f} bytes each)")
    return files, entries


def _wasm_plans(ctx: BuildContext) -> dict[str, dict]:
    """The fp32 variants' wasm plans (webbuild.pipeline.wasm_budget): each graph's form for the wasm EP and
    the memory estimate of every option, into the report; the page reads `fits` from the manifest entry
    and says the model needs WebGPU where it is false (no option fits)."""
    from webbuild.pipeline.wasm_budget import GIB, variant_plan

    runtime = json.loads((ctx.state.assembled / RUNTIME_FILE).read_text())
    plans = {}
    for name, v in ctx.state.variants.items():
        if "wasm" not in v.providers:
            continue  # a variant the wasm EP never runs (webbuild.site.contract.VARIANTS)
        fit = plans[name] = variant_plan(v.dir, v.files, runtime, decoder_sessions=2 if ctx.cfg.adapters else 1)
        ctx.report.variants.setdefault(name, {})["wasm"] = fit
        options = "; ".join(f"{_forms_text(o['forms'])}: {o['need_bytes'] / GIB:.2f} GiB" for o in fit["options"])
        if fit["fits"]:
            log.info(f"{name}: wasm fallback needs about {fit['need_bytes'] / GIB:.2f} GiB "
                     f"of {fit['budget_bytes'] / GIB:.2f} GiB ({_forms_text(fit['forms'])}; options: {options})")
        else:
            log.warning(f"{name}: no wasm fallback: needs {fit['need_bytes'] / GIB:.1f} GiB of the "
                        f"{fit['budget_bytes'] / GIB:.1f} GiB a wasm page gets; visitors without WebGPU "
                        f"are told the model needs WebGPU (options: {options})")
    return plans


def _forms_text(forms: dict[str, str]) -> str:
    return ", ".join(f"{graph} {form}" for graph, form in forms.items())


def _webgpu_forms_and_wasm_twins(ctx: BuildContext, plans: dict[str, dict]) -> None:
    """Every decoder becomes the WebGPU form (Q/K norms inside GroupQueryAttention) and gets its step
    form for graph capture (role decoder_step); fp32 variants keep the form the wasm fallback runs as a
    twin graph (role decoder_wasm); each costs a few KB: the weights file is shared. With adapters, the
    adapted decoder (role decoder_lora) is made first and gets the same forms (decoder_lora_step,
    decoder_lora_wasm). A quantized encoder gets a twin too (role encoder_wasm) where its plan folds its
    MatMulNBits to float. See webbuild.pipeline.forms and webbuild.quantize.wasm_twin. The report's decoder
    census then counts the shipped graph."""
    from webbuild.quantize.wasm_twin import twin_name, wasm_graph

    for name, v in ctx.state.variants.items():
        dec, enc = v.files.get("decoder"), v.files.get("encoder")
        forms = plans.get(name, {}).get("forms", {})  # wasm forms; none for variants the wasm EP never runs
        if dec and ctx.cfg.adapters:
            v.files["decoder_lora"] = _adapted_decoder(v, dec)
            _decoder_forms(ctx, v, "decoder_lora", name in plans, forms.get("decoder") == "float")
        if dec:
            _decoder_forms(ctx, v, "decoder", name in plans, forms.get("decoder") == "float")
        # the int4 encoder's MatMulNBits are slow on wasm: folded to float where the plan can afford it
        if enc and forms.get("encoder") == "float" and wasm_graph(v.dir / enc, v.dir / twin_name(enc)):
            v.files["encoder_wasm"] = twin_name(enc)
        if dec and name in ctx.report.variants:
            ctx.report.variants[name]["decoder"] |= census(op_census(v.dir / dec))


def _decoder_forms(ctx: BuildContext, v: Variant, role: str, wasm_twin: bool, fold_matmuls: bool) -> None:
    """The WebGPU form of the decoder of `role` in place, its wasm twin (`<role>_wasm`) and its step
    form (`<role>_step`: the captured decode's graph, webbuild.pipeline.step_form)."""
    from webbuild.pipeline.forms import step_decoder, webgpu_decoder

    level = ctx.cfg.quantize.webgpu_accuracy_level if ctx.cfg.quantize.method != "none" else None
    graph = v.files[role]
    if twin := webgpu_decoder(v.dir, graph, wasm_twin=wasm_twin, accuracy_level=level, fold_matmuls=fold_matmuls):
        v.files[f"{role}_wasm"] = twin
    if step := step_decoder(v.dir, graph):
        v.files[f"{role}_step"] = step


def _adapted_decoder(v: Variant, dec: str) -> str:
    from webbuild.pipeline.forms import lora_decoder
    from webbuild.pipeline.lora_form import NoProjections

    try:
        return lora_decoder(v.dir, dec)
    except NoProjections as exc:
        raise BuildError(f"adapters: the {v.name} decoder cannot take LoRA adapters: {exc}") from exc


def stage_render(ctx: BuildContext) -> None:
    for warning in render_site(ctx.cfg, ctx.stage_dir, {"variants": list(ctx.state.variants)}):
        log.warning(warning)
    stats = dist_file_stats(ctx.stage_dir, ctx.cfg.shard.max_bytes)
    if stats["oversize_files"]:
        raise BuildError(f"files over shard.max_bytes ({ctx.cfg.shard.max_bytes}): "
                         f"{', '.join(stats['oversize_files'])}")


STAGES: list[tuple[str, Callable[[BuildContext], None]]] = [
    ("source", stage_source),
    ("fuse", stage_fuse),
    ("assemble", stage_assemble),
    ("quantize", stage_quantize),
    ("shard", stage_shard),
    ("render", stage_render),
]

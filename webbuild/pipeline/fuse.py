"""`webbuild fuse SRC -o OUT [--report R.json] [--no-quantize]` as plain functions (the CLI wiring: webbuild.cli)."""

from __future__ import annotations

import gc
import json
import logging
import resource
import time
from pathlib import Path

from webbuild import layouts
from webbuild.config import Quantize
from webbuild.errors import FusionIncomplete, SourceError
from webbuild.fusion import rule_report as fusion_report
from webbuild.fusion.fuse_decoder import decoder_path, fuse_decoder, save
from webbuild.fusion.fuse_encoder import ENCODER as ENCODER_NAME
from webbuild.fusion.fuse_encoder import fuse_encoder
from webbuild.fusion.validate import check_file
from webbuild.graph.census import op_census
from webbuild.graph.load import load_onnx
from webbuild.pipeline.publish import making, output_lock, output_problem, publish, staging, user_files
from webbuild.reference.source_files import check_source
from webbuild.site.manifest import write_json_atomic

OUT_NAME = "decoder.onnx"
FUSE_FILES = (OUT_NAME, f"{OUT_NAME}.data", ENCODER_NAME, f"{ENCODER_NAME}.data")  # what `fuse` writes
log = logging.getLogger(__name__)


def run_fuse(src: Path, out: Path, report: Path | None = None, quantize: bool = True, pack_qkv: bool = True,
             prune_lm_head: bool = True, min_positions: int = 0) -> dict:
    """Fuse the decoder of SRC (a source folder of any layout, or a decoder .onnx) into
    OUT/decoder.onnx(.data), and the encoder beside it into OUT/encoder.onnx (report under "encoder";
    see `run_fuse_encoder`).

    With `quantize` (`webbuild fuse` without --no-quantize) the build's default quantization follows
    (see `quantize_in_place`). Returns the report dict (`summary` prints it) and writes it to `report`
    when given; logs what was not fused and the files written. `pack_qkv` and `prune_lm_head` go to
    fusion.fuse.fuse_decoder, and `min_positions`: GroupQueryAttention's cos/sin caches cover at least that many
    positions (one chunk of long audio), beyond the model's own maximum. Raises when the result is not a valid
    onnxruntime graph."""
    src, out = Path(src), Path(out)
    _check_sources(src)  # checked first: a missing or corrupt graph is reported before anything else
    side = _side_dir(src) if quantize else None  # checked first: no partial output
    t0 = time.perf_counter()
    log.debug(f"fusing {src}")
    model, rep = fuse_decoder(src, pack_qkv=pack_qkv, prune_lm_head_=prune_lm_head, min_positions=min_positions)
    t1 = time.perf_counter()
    path = save(model, out, OUT_NAME)
    del model
    gc.collect()  # an onnx-ir graph is reference cycles: free its weights before onnxruntime loads the file
    seconds = {"fuse": round(t1 - t0, 2)}
    if side is not None:  # with quantize
        q = Quantize()
        log.info(f"quantizing (int{q.bits} MatMulNBits, block {q.block_size}, accuracy level {q.accuracy_level}; "
                 "int4 embedding lookup)")
        rep["quantize"] = quantize_in_place(path, side)
        rep.update(ops_fused=rep["ops_after"], ops_after=rep["quantize"].pop("ops"))
        rep["nodes_after"] = sum(rep["ops_after"].values())
        seconds["quantize"] = round(time.perf_counter() - t1, 2)
    t2 = time.perf_counter()
    check_file(path)
    rep.update(source=str(src), output=str(path),
               seconds=seconds | {"save_and_check": round(time.perf_counter() - t2, 2)},
               peak_rss_mib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))
    _log_result(rep, path)
    encoder = run_fuse_encoder(src, out)
    if encoder is not None:
        rep["encoder"] = encoder
        rep["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    if report is not None:
        Path(report).parent.mkdir(parents=True, exist_ok=True)
        Path(report).write_text(json.dumps(rep, indent=2) + "\n")
    return rep


def fuse_command(src: Path, output: Path, report: Path | None, quantize: bool) -> dict:
    """`webbuild fuse`: run_fuse into a folder beside `output`, published in one step at the end
    (webbuild.pipeline.publish), so that a failure or a kill leaves no half-written graph; the files the
    user keeps in `output` stay. Returns the report with the published paths."""
    src, output = Path(src), Path(output).resolve()
    _check_output(output)
    with output_lock(output), staging(output) as tmp:  # run_fuse checks the sources before it writes
        with making(output, tmp):
            rep = run_fuse(src, tmp / "out", quantize=quantize)
        publish(tmp / "out", output, keep=user_files(output, FUSE_FILES))
    for graph in graphs(rep).values():
        graph["output"] = str(output / Path(graph["output"]).name)
    if report is not None:
        Path(report).parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(Path(report), rep)
    return rep


def _check_output(output: Path) -> None:
    """`fuse` replaces its output folder: a new, empty or earlier one (its decoder.onnx), never `-o ~`."""
    if problem := output_problem(output):
        raise SourceError(problem)
    if output.is_dir() and any(output.iterdir()) and not (output / OUT_NAME).is_file():
        raise SourceError(f"{output} is a folder that holds no earlier `webbuild fuse` output (no "
                          f"{OUT_NAME}), and the output folder is replaced whole: choose a new or empty one with -o")


def run_fuse_encoder(src: Path, out: Path) -> dict | None:
    """Fuse the encoder beside SRC's decoder (SRC/encoder.onnx, or next to a merged .onnx) into
    OUT/encoder.onnx(.data), weights left float (the build quantizes them per encoder.precision);
    None when the source has no encoder. Returns its report (census before/after, what was not fused)."""
    src = (src if src.is_dir() else src.parent) / ENCODER_NAME
    if not src.is_file():
        return None
    t0 = time.perf_counter()
    log.debug(f"fusing {src}")
    model, rep = fuse_encoder(src)
    path = save(model, out, ENCODER_NAME)
    del model
    check_file(path)
    rep.update(source=str(src), output=str(path), seconds={"fuse_save_and_check": round(time.perf_counter() - t0, 2)})
    _log_result(rep, path)
    return rep


def _log_result(rep: dict, path: Path) -> None:
    # what was not fused is told once, at the end (`summary`, the build's table); the file's name only:
    # in a build `path` lies in the staging folder, deleted when the build ends; `webbuild fuse` says
    # where it wrote (rep["output"])
    log.info(f"fused {path.name}: {rep['nodes_before']} -> {rep['nodes_after']} nodes")


def summary(rep: dict) -> list[str]:
    """A run_fuse report as lines: the op table and notes of the decoder, then of the encoder after
    "encoder:", then what the rules left alone in either, with where and why (fusion.report.summary)."""
    lines = []
    for name, graph in graphs(rep).items():
        lines += [*([f"{name}:"] if name != "decoder" else []), *op_table(graph["ops_before"], graph["ops_after"]),
                  *(f"note: {note}" for note in graph["notes"])]
    return lines + fusion_report.summary(left_alone(rep))


def graphs(rep: dict) -> dict[str, dict]:
    """A run_fuse report's graph reports by name: decoder, and encoder when there was one."""
    return {"decoder": rep, **({"encoder": rep["encoder"]} if "encoder" in rep else {})}


def left_alone(rep: dict) -> dict[str, dict]:
    """What fusion.report's summary and strict_failures read, per graph of a run_fuse report."""
    return {name: {"not_fused": g["not_fused"], "ops": g["ops_after"],
                   **({"left_over": g["left_over"]} if "left_over" in g else {})} for name, g in graphs(rep).items()}


def check_strict(rep: dict, setting: str, with_summary: bool) -> None:
    """--strict / fusion.strict (`setting` names it): FusionIncomplete (exit code 1) when an attention or a
    norm was left decomposed in a graph of the run_fuse report `rep`. `with_summary`: the not-fused summary,
    every place, follows the first line (a build stops here, before its closing table and its report)."""
    failures = fusion_report.strict_failures(left_alone(rep))
    if failures:
        detail = fusion_report.summary(left_alone(rep), shown=None) if with_summary else []
        where = "" if with_summary else "; where and why: above"
        raise FusionIncomplete("\n".join([f"{'; '.join(failures)} ({setting}{where})", *detail]))


def check_growing_cache(rep: dict, src: Path) -> None:
    """A build's decoder grows its KV cache (the runtime feeds past and present of the length written so far,
    the check stage runs the source so): a source writing a static cache in place (the run_fuse report's
    `static_kv`) is refused in one line. `webbuild fuse` fuses that form on its own."""
    names = rep.get("static_kv") or []
    if names:
        raise SourceError(f"{src}: the decoder writes a static KV cache in place by ScatterND ({names[0]}"
                          f"{f' and {len(names) - 1} more' if len(names) > 1 else ''}); a build needs past and "
                          "present of free length (the runtime grows them): export the decoder with a growing "
                          "cache, or fuse this one alone with `webbuild fuse`")


def quantize_in_place(path: Path, side: Path) -> dict:
    """The build's default quantization (webbuild.quantize with `Quantize()`, model.yaml's defaults: int4
    symmetric MatMulNBits; the embeddings an int4 GatherBlockQuantized lookup, sharing lm_head's weight when
    tied) of the saved graph at `path`. The graph then takes input_ids, audio_features and audio_offset
    instead of inputs_embeds, as the build's decoders do. `side`: where config.json and
    embed_tokens.bin are. Returns the quantize report with the new op census under "ops"."""
    from webbuild.quantize.lazy import load_lazily
    from webbuild.quantize.variants import embed_table, quantize_decoder, save_model

    s = Quantize()
    table, cfg = embed_table(side)
    # float weights read one at a time, as the build's quantize stage does (webbuild.quantize.lazy)
    model, rep = quantize_decoder(load_lazily(path), table, cfg, s)
    save_model(model, path)
    return {"settings": s.model_dump(), **rep, "ops": op_census(model)}


def _check_sources(src: Path) -> None:
    """The graphs fusion reads (the decoder, the encoder beside it), checked by webbuild.graph.load:
    fusion's own loader (onnx_ir) fails on a corrupt file, truncated or linked weights with a traceback."""
    folder = src if src.is_dir() else src.parent
    found = layouts.detect(src) if src.is_dir() else None
    if found is not None and _asr_export(src):
        check_source(src, found)  # every file, as the build's source stage checks them
    graphs = [folder / name for name in found.graphs] if found is not None else [decoder_path(src)]
    for path in (*graphs, folder / ENCODER_NAME):
        if path.is_file():
            load_onnx(path, own_files=True)  # checked before another library opens it


def _asr_export(folder: Path) -> bool:
    """A Qwen3-ASR export (config.json with its decoder section, or none that parses: check_source says why),
    not a text decoder exported by Optimum beside a Hugging Face config.json, which fusion takes too."""
    try:
        return isinstance(json.loads((folder / "config.json").read_bytes()).get("decoder"), dict)
    except (OSError, ValueError, AttributeError):
        return True


def _side_dir(src: Path) -> Path:
    """The folder of config.json and embed_tokens.bin, which quantization needs."""
    side = src if src.is_dir() else src.parent
    missing = [n for n in ("config.json", "embed_tokens.bin") if not (side / n).is_file()]
    if missing:
        raise SourceError(f"{side}: quantization needs {' and '.join(missing)} beside the decoder "
                          "(the embedding table becomes an int4 lookup); add them or pass --no-quantize")
    return side


def op_table(before: dict[str, int], after: dict[str, int]) -> list[str]:
    """Rows 'op  before -> after', ops sorted by their count before then after."""
    ops = sorted(set(before) | set(after), key=lambda op: (-before.get(op, 0), -after.get(op, 0), op))
    width = max(len(op) for op in ops) if ops else 2
    rows = [f"{'op':<{width}}  before -> after"]
    rows += [f"{op:<{width}}  {before.get(op, 0):>6} -> {after.get(op, 0)}" for op in ops]
    rows.append(f"{'total':<{width}}  {sum(before.values()):>6} -> {sum(after.values())}")
    return rows

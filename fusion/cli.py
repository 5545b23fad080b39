"""`webbuild fuse SRC -o OUT [--report R.json]` as a plain function (the CLI wiring lives in pipeline/)."""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Callable
from pathlib import Path

from fusion.fuse import fuse_decoder, save
from fusion.validate import check_file

OUT_NAME = "decoder.onnx"


def run_fuse(src: Path, out: Path, report: Path | None = None, progress: Callable[[str], None] = print) -> dict:
    """Fuse the decoder of SRC (split-layout folder or merged .onnx) into OUT/decoder.onnx(.data).

    Prints the op table (op, nodes before -> after) through `progress`; returns the report dict and
    writes it to `report` when given. Raises when the result is not a valid onnxruntime graph."""
    t0 = time.perf_counter()
    progress(f"fusing {src}")
    model, rep = fuse_decoder(Path(src))
    t1 = time.perf_counter()
    path = save(model, Path(out), OUT_NAME)
    check_file(path)
    t2 = time.perf_counter()
    rep.update(source=str(src), output=str(path),
               seconds={"fuse": round(t1 - t0, 2), "save_and_check": round(t2 - t1, 2)},
               peak_rss_mib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))
    for line in op_table(rep["ops_before"], rep["ops_after"]):
        progress(line)
    for miss in rep["not_fused"]:
        progress(f"not fused ({miss['rule']}) at {miss['at']}: {miss['why']}")
    for note in rep["notes"]:
        progress(f"note: {note}")
    progress(f"wrote {path} ({rep['nodes_before']} -> {rep['nodes_after']} nodes)")
    if report is not None:
        Path(report).parent.mkdir(parents=True, exist_ok=True)
        Path(report).write_text(json.dumps(rep, indent=2) + "\n")
    return rep


def op_table(before: dict[str, int], after: dict[str, int]) -> list[str]:
    """Rows 'op  before -> after', ops sorted by their count before then after."""
    ops = sorted(set(before) | set(after), key=lambda op: (-before.get(op, 0), -after.get(op, 0), op))
    width = max(len(op) for op in ops) if ops else 2
    rows = [f"{'op':<{width}}  before -> after"]
    rows += [f"{op:<{width}}  {before.get(op, 0):>6} -> {after.get(op, 0)}" for op in ops]
    rows.append(f"{'total':<{width}}  {sum(before.values()):>6} -> {sum(after.values())}")
    return rows

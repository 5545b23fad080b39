"""Each model.yaml adapter as the file the site ships: the adapted decoder's lora.* inputs packed by
webbuild.site.adapter_pack (docs/adapters.md), with its manifest entry."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from webbuild.config import Adapter
from webbuild.pipeline.build_report import BuildReport
from webbuild.site.contract import RUNTIME_FILE
from webbuild.text import size

log = logging.getLogger(__name__)


def pack_adapters(adapters: list[Adapter], assembled: Path, folder: Path,
                  report: BuildReport) -> tuple[dict[str, Path], dict[str, dict]]:
    """Each adapter's file in `folder` by name, and its manifest entry; the report gets each file's size
    against the adapter's rank-32 int8 size (one byte per parameter)."""
    from webbuild.adapters import CONFIG
    from webbuild.site.adapter_pack import graph_inputs, pack, stored_parameters

    if not adapters:
        return {}, {}
    layers = json.loads((assembled / RUNTIME_FILE).read_text())["decoder"]["num_layers"]
    folder.mkdir(exist_ok=True)
    files, entries = {}, {}
    for a in adapters:
        inputs = graph_inputs(a.path, layers, a.scale)
        data, tensors = pack(inputs, a.precision)
        name = f"adapter.{a.name}.bin"
        (folder / name).write_bytes(data)
        files[name] = folder / name
        rank = json.loads((a.path / CONFIG).read_text())["r"]
        entries[a.name] = {"file": name, "precision": a.precision, "rank": rank, "scale": a.scale,
                           "bytes": len(data), "tensors": tensors,
                           **({"description": a.description} if a.description else {})}
        parameters = stored_parameters(tensors)  # the adapter's own: the ups' zero rows are not stored
        report.adapters[a.name] = {"bytes": len(data), "parameters": parameters,
                                   "int8_ratio": round(len(data) / parameters, 4)}
        log.info(f"adapter {a.name}: {size(len(data))} ({a.precision}, {parameters:,} parameters, "
                 f"{len(data) / parameters:.3f} bytes each)")
    return files, entries

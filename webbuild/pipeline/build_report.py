"""build-report.json: per-graph op census, file sizes, shard figures, stage timings and memory.

One naming convention: a graph is described by `{"nodes": N, "ops": {op type: count}}` (see `census`),
nested under what it is: graphs.<name>.source / .fused, variants.<name>.decoder (plus its "bytes") and
variants.<name>.encoder; sizes end in `_bytes` (or are a file's "bytes"), times in `seconds`.
"""

from __future__ import annotations

import json
import resource
from dataclasses import asdict, dataclass, field
from pathlib import Path

from webbuild.forms.form import summary as forms_summary
from webbuild.fusion.rule_report import summary as fusion_summary
from webbuild.text import size

REPORT_NAME = "build-report.json"


def census(ops: dict[str, int]) -> dict:
    """A graph's entry in the report, from its op census (webbuild.graph.census.op_census)."""
    return {"nodes": sum(ops.values()), "ops": ops}


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass
class BuildReport:
    name: str
    graphs: dict[str, dict] = field(default_factory=dict)  # graph -> {"source": census, "fused": census}
    variants: dict[str, dict] = field(default_factory=dict)  # variant -> {"decoder", "encoder", "check", "files"}
    quantize: dict = field(default_factory=dict)
    adapters: dict[str, dict] = field(default_factory=dict)  # name -> {"bytes", "parameters", "int8_ratio"}
    # the graph forms (webbuild.forms.form.Report): made {form, graph, file}, not_made {form, graph, why, loses}
    forms: dict[str, list[dict]] = field(default_factory=lambda: {"made": [], "not_made": []})
    files: dict = field(default_factory=dict)
    stages: list[dict] = field(default_factory=list)

    def add_stage(self, name: str, seconds: float, peak_rss: int) -> None:
        self.stages.append({"name": name, "seconds": round(seconds, 3), "peak_rss_bytes": peak_rss})

    def measure_files(self, root: Path) -> None:
        """Sizes, and the paths the build wrote (`written`): a rebuild keeps every other file it finds in the
        output (the user's CNAME, .nojekyll, ...; webbuild.pipeline.publish)."""
        files = {p.relative_to(root).as_posix(): p.stat().st_size for p in root.rglob("*") if p.is_file()}
        sizes = list(files.values())
        self.files = {"count": len(sizes) + 1, "total_bytes": sum(sizes), "max_file_bytes": max(sizes, default=0),
                      "written": sorted([*files, REPORT_NAME])}

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    def table(self) -> str:
        rows = [f"{'graph':<24}{'nodes before':>14}{'nodes after':>13}"]
        for name, g in self.graphs.items():
            rows.append(f"{name:<24}{g['source']['nodes']:>14}{g.get('fused', {}).get('nodes', '-'):>13}")
        rows.append(f"files: {self.files.get('count')}  total {size(self.files.get('total_bytes', 0))}  "
                    f"largest {size(self.files.get('max_file_bytes', 0))}")
        rows += [f"stage {s['name']:<12}{s['seconds']:8.1f}s  peak {size(s['peak_rss_bytes']):>10}"
                 for s in self.stages]
        rows += [f"samples {name}: WER " + ", ".join(f"{clip} {r['wer']:.2f}" for clip, r in samples.items())
                 for name, v in self.variants.items() if (samples := v.get("check", {}).get("samples"))]
        fused = {name: {"not_fused": g["not_fused"], "ops": g["fused"]["ops"]}
                 for name, g in self.graphs.items() if "not_fused" in g}
        return "\n".join(rows + fusion_summary(fused) + forms_summary(self.forms))

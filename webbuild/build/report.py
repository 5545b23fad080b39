"""build-report.json: per-graph op census, file sizes, shard figures, stage timings and memory."""

from __future__ import annotations

import json
import resource
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import onnx


def op_census(model: onnx.ModelProto) -> dict[str, int]:
    """op type -> count over the main graph (domain-qualified for non-default domains)."""
    ops = Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in model.graph.node)
    return dict(sorted(ops.items()))


def graph_census(path: Path) -> dict:
    model = onnx.load(str(path), load_external_data=False)
    ops = op_census(model)
    return {"nodes_before": sum(ops.values()), "ops_before": ops}


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass
class BuildReport:
    name: str
    graphs: dict[str, dict] = field(default_factory=dict)
    variants: dict[str, dict] = field(default_factory=dict)
    quantize: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)
    stages: list[dict] = field(default_factory=list)

    def add_stage(self, name: str, seconds: float, peak_rss: int) -> None:
        self.stages.append({"name": name, "seconds": round(seconds, 3), "peak_rss_bytes": peak_rss})

    def measure_files(self, root: Path) -> None:
        sizes = [p.stat().st_size for p in root.rglob("*") if p.is_file()]
        self.files = {"count": len(sizes) + 1, "total_bytes": sum(sizes), "max_file_bytes": max(sizes, default=0)}

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    def table(self) -> str:
        rows = [f"{'graph':<24}{'nodes before':>14}{'nodes after':>13}"]
        for name, g in self.graphs.items():
            rows.append(f"{name:<24}{g.get('nodes_before', ''):>14}{g.get('nodes_after', '-'):>13}")
        rows.append(f"files: {self.files.get('count')}  total {self.files.get('total_bytes', 0) / 1e6:.1f} MB  "
                    f"largest {self.files.get('max_file_bytes', 0) / 1e6:.1f} MB")
        rows += [f"stage {s['name']:<12}{s['seconds']:8.1f}s  peak {s['peak_rss_bytes'] / 2**20:8.0f} MiB"
                 for s in self.stages]
        return "\n".join(rows)

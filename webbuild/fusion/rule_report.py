"""What the rules did: counts of fusions and, for every pattern left alone, where and why."""

from __future__ import annotations

from dataclasses import dataclass, field

from webbuild.text import plural


@dataclass
class Report:
    fused: dict[str, int] = field(default_factory=dict)
    missed: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def hit(self, rule: str, n: int = 1) -> None:
        self.fused[rule] = self.fused.get(rule, 0) + n

    def miss(self, rule: str, where: str, why: str) -> None:
        self.missed.append({"rule": rule, "at": where, "why": why})

    def as_dict(self) -> dict:
        return {"fused": dict(self.fused), "not_fused": list(self.missed), "notes": list(self.notes)}


# What --strict (fusion.strict) fails on: a miss of an attention or norm rule, and the op an attention or a
# norm left decomposed still holds (a spelling no rule recognised records no miss).
STRICT_RULES = {"gqa": "attention", "encoder_attention": "attention", "rms_norm": "norm",
                "skip_rms_norm": "norm", "layer_norm": "norm", "skip_layer_norm": "norm"}
LEFT_OVER = {"Softmax": "attention", "ReduceMean": "norm"}
SHOWN = 3  # places listed per rule and reason by default; the JSON reports have them all


def summary(graphs: dict[str, dict], shown: int | None = SHOWN) -> list[str]:
    """The one account of what fusion left alone, over graphs {name: {"not_fused": misses, "ops": census
    after}}: per graph, rule and reason, how many and where (the first `shown` places; None: all); then
    the attention and norm ops left. Empty when every pattern fused."""
    lines = []
    for graph, rep in graphs.items():
        groups: dict[tuple[str, str], list[str]] = {}
        for miss in rep["not_fused"]:
            groups.setdefault((miss["rule"], miss["why"]), []).append(miss["at"])
        for (rule, why), places in groups.items():
            cut = len(places) if shown is None else shown
            more = f" (+{len(places) - cut} more in the JSON report)" if len(places) > cut else ""
            lines += [f"  {graph}: {rule} x{len(places)}: {why}", f"    at {', '.join(places[:cut])}{more}"]
        lines += [f"  {graph}: {n} {op} left ({LEFT_OVER[op]} not fused)"
                  for op, n in rep["ops"].items() if op in LEFT_OVER]
    return ["not fused:", *lines] if lines else []


def strict_failures(graphs: dict[str, dict]) -> list[str]:
    """The attention and norms `summary`'s graphs left decomposed, one line per graph and kind; empty when
    none (what --strict and fusion.strict turn into exit code 1)."""
    out = []
    for graph, rep in graphs.items():
        counts: dict[str, int] = {}
        for miss in rep["not_fused"]:
            kind = STRICT_RULES.get(miss["rule"])
            if kind:
                counts[kind] = counts.get(kind, 0) + 1
        for op, n in rep["ops"].items():
            if op in LEFT_OVER:
                counts[LEFT_OVER[op]] = max(counts.get(LEFT_OVER[op], 0), n)
        out += [f"{graph}: {plural(n, kind + ' pattern')} not fused" for kind, n in counts.items()]
    return out

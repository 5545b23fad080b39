"""What the rules did: counts of fusions and, for every pattern left alone, where and why."""

from __future__ import annotations

from dataclasses import dataclass, field


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

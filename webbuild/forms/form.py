"""The graph forms' one driver, as webbuild.fusion.rule is the fusion rules'.

A `Form` is a graph the build derives from another one: its `name` (what the report counts it under), what it
`applies_to` (in words: the report's line and the docs'), and `make`, which writes it and returns what it made
(`Made`: the file, with any parts it left as they were), why it made nothing (`Miss`: reported), or None (not its
graph, by design: nothing to report). A rewrite deep inside a form may raise `NotApplicable` instead of returning;
the driver records that as a Miss too. `Report.make` runs one form on one graph and records the outcome; its dict
goes into build-report.json as `forms` (`made`, `not_made`), beside fusion's `graphs.<graph>.not_fused`.

A Miss `loses` a form when the variant ships without a form it would otherwise have, or with one its plan did not
ask for; `strict_failures` lists those, and `--strict` (fusion.strict) makes them exit code 1. Which misses lose is
each form's call, written where it returns them (docs/architecture.md, "Graph forms", lists them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from webbuild.text import plural


@dataclass(frozen=True)
class Miss:
    """Why a form was not made of a graph, or what part of it a form left as it was."""
    reason: str
    loses: bool = True  # the variant ships without a form (or part of one) it would otherwise have


@dataclass(frozen=True)
class Made:
    """A form written as `file`; `left` holds what of it the form left as it was (each one reported)."""
    file: str
    left: tuple[Miss, ...] = ()


class NotApplicable(ValueError):
    """Raised inside a form's rewrite: the graph is not one the form can be made of (recorded as a losing Miss)."""


@dataclass(frozen=True)
class Form:
    """A graph form: its name, what it is made of, and `make` (the graph's files in, Made | Miss | None out)."""
    name: str
    applies_to: str
    make: Callable[..., Made | Miss | None]


@dataclass
class Report:
    made: list[dict] = field(default_factory=list)  # {"form", "graph", "file"}
    missed: list[dict] = field(default_factory=list)  # {"form", "graph", "why", "loses"}

    def make(self, form: Form, graph: str, *args: Any, **kwargs: Any) -> str | None:
        """`form` made of `graph` (a label: the variant and the role or file); the written file's name, or None."""
        try:
            out = form.make(*args, **kwargs)
        except NotApplicable as exc:
            out = Miss(str(exc))
        if isinstance(out, Miss):
            self.miss(form, graph, out)
            return None
        if out is None:
            return None
        self.made.append({"form": form.name, "graph": graph, "file": out.file})
        for left in out.left:
            self.miss(form, graph, left)
        return out.file

    def miss(self, form: Form, graph: str, miss: Miss) -> None:
        self.missed.append({"form": form.name, "graph": graph, "why": miss.reason, "loses": miss.loses})

    def as_dict(self) -> dict:
        return {"made": list(self.made), "not_made": list(self.missed)}


def strict_failures(forms: dict) -> list[str]:
    """One line per losing miss of a `Report.as_dict` (what --strict and fusion.strict turn into exit code 1)."""
    lost = [m for m in forms.get("not_made", []) if m["loses"]]
    return [f"{plural(len(lost), 'graph form')} lost", *(f"{m['graph']}: {m['form']}: {m['why']}" for m in lost)] \
        if lost else []


def summary(forms: dict) -> list[str]:
    """The closing table's account of the forms not made: every miss, losing ones marked; empty when none."""
    misses = forms.get("not_made", [])
    lines = [f"  {m['graph']}: {m['form']}: {m['why']}{' (lost: --strict fails)' if m['loses'] else ''}"
             for m in misses]
    return ["graph forms not made:", *lines] if misses else []

"""A zoo source with some of the fusion rules applied, for the tests of one rule."""

from __future__ import annotations

from pathlib import Path

from webbuild.fusion import cleanup
from webbuild.fusion.fuse_decoder import load_source
from webbuild.fusion.rule_report import Report
from webbuild.graph.ir import dead_code_elimination


def partly_fused(path: Path, rules):
    """Load + cleanup a zoo source and apply `rules` (callables (model, report)) in order."""
    model, _ = load_source(path)
    cleanup.apply(model)
    report = Report()
    for rule in rules:
        rule(model, report)
        dead_code_elimination(model)
    return model, report

"""The fusion rules' one driver.

A `Rule` names the op types it anchors on; `match` turns each anchor into a match (what to rewrite),
a `Miss` (a pattern the rule recognises but cannot fuse, and why: reported) or None (not its
pattern: nothing to report); `rewrite` replaces a match in the graph. `Rule.apply` runs one rule
over a graph, anchors collected first, and records its hits and misses in a Report. A rule list is
an ordered tuple of `Step`s (rules, and the cleanup pass), each under a flag of the run; `run`
applies the list, `fuse_graph` adds the op census around it (fuse_decoder's and fuse_encoder's report).

Where a rule is a plain subgraph that ends at its anchor (the residual skip norms) it matches with
onnxscript's `rewriter.pattern` (`pattern_match`). The rewrite stays ours: onnxscript's RewriteRule
names the new nodes itself and tags them with metadata, which would change the files the build ships.
rms_norm, layer_norm, gelu and bias_gelu say in their docstrings why they stay structural. The
structural rules below are not patterns because what they recognise is not one fixed subgraph:
- attention (gqa, encoder_attention) is a walk from Softmax out to both ends: casts, the mask Add and
  scalar factors may or may not be there and stand in several places, repeat_kv and the past-KV Concat
  are optional, Q/K norms may sit between projection and heads, and head counts are read from
  Reshape targets and checked against each other;
- RoPE (rope) is recognised by its rotate_half Concat or its interleaved pair rotation, in either
  operand order, and its cos/sin are rebuilt as caches from the graph's inv_freq constant or tables,
  then checked by evaluating the source subgraph; attention masks likewise are checked by their values;
- GQA's interface and merge_split act on the graph's inputs and outputs (the past/present KV, the
  stacked outputs of a split export), not on a subgraph; prune_lm_head likewise starts from `logits`;
- packed QKV (packed_qkv, encoder_packed_qkv) gathers three branches that meet only at the attention
  node, and whether they pack depends on their weights' shapes and quantization attributes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import onnx_ir as ir
from onnxscript.rewriter import pattern

from webbuild.fusion import cleanup
from webbuild.fusion.rule_report import Report, left_over
from webbuild.graph.ir import census, dead_code_elimination, sort_nodes

M = TypeVar("M")


@dataclass(frozen=True)
class Miss:
    """Why a rule left an anchor alone."""
    reason: str
    at: str | None = None  # where, when not the anchor (the DequantizeLinear behind a MatMul, a graph output)


def _no_notes(hits: int) -> list[str]:
    return []


def _nothing() -> None:
    pass


@dataclass(frozen=True)
class Rule(Generic[M]):
    """A fusion rule: where it looks (anchors, domain), what it finds there (match) and what it makes
    of it (rewrite); `name` is what the report counts hits and misses under."""
    name: str
    anchors: tuple[str, ...]  # op types it anchors on; () anchors on the graph itself, once
    match: Callable[[Any], M | Miss | None]  # an anchor node (the graph for anchors ()) -> ...
    rewrite: Callable[[ir.Graph, M], None]
    domain: str | None = None  # the anchors' domain, when it matters
    notes: Callable[[int], list[str]] = _no_notes  # hits -> notes for the report
    setup: Callable[[], None] = _nothing  # before each graph: resets a rule's per-graph state (gqa's)

    def apply(self, model: ir.Model, report: Report) -> int:
        """Match and rewrite every anchor; returns the number of rewrites."""
        g, hits = model.graph, 0
        self.setup()
        for anchor in self._anchors(g):
            found = self.match(anchor)
            if isinstance(found, Miss):
                report.miss(self.name, found.at or anchor.name or _kind(anchor), found.reason)
            elif found is not None:
                self.rewrite(g, found)
                hits += 1
        if hits:
            report.hit(self.name, hits)
        report.notes.extend(self.notes(hits))
        return hits

    def _anchors(self, g: ir.Graph) -> list:
        if not self.anchors:
            return [g]
        return [n for n in g if n.op_type in self.anchors and (self.domain is None or n.domain == self.domain)]


def _kind(anchor: ir.Node | ir.Graph) -> str:
    return anchor.op_type if isinstance(anchor, ir.Node) else "graph"


def pattern_match(target: pattern.Pattern, node: ir.Node) -> pattern.MatchResult | None:
    """onnxscript's match of `target` ending at `node`, or None. The matched nodes' other uses are
    allowed: the rewrite redirects them (a residual sum goes on to the next layer)."""
    if node.graph is None:
        return None
    # onnxscript types the first argument as the model, which the matcher does not read: none is at hand here
    found = target.match(None, node.graph, node, check_nodes_are_removable=False)  # type: ignore[arg-type]
    return found if found else None


Pass = Callable[[ir.Model], None]


@dataclass(frozen=True)
class Step:
    """One entry of a rule list: a rule, or a pass over the whole model, and the flag it runs under."""
    action: Rule | Pass
    when: str | None = None  # a flag of the run; None: always


def run(model: ir.Model, steps: Sequence[Step], report: Report, flags: Mapping[str, bool] | None = None) -> None:
    """Apply `steps` in order, those whose flag is set (a flag missing from `flags` is an error); dead
    nodes go after each rule, and what the rewrites left constant (e.g. a tied weight's Transpose) is
    folded at the end."""
    for step in steps:
        if step.when is not None and not (flags or {})[step.when]:
            continue
        if isinstance(step.action, Rule):
            step.action.apply(model, report)
            dead_code_elimination(model)
        else:
            step.action(model)
    if report.fused:
        cleanup.apply(model)


def fuse_graph(model: ir.Model, steps: Sequence[Step], flags: Mapping[str, bool] | None = None) -> dict:
    """`run` on a fresh Report; its dict (fused, not_fused, notes) with the op census before and after, the
    nodes sorted into topological order first (`sorted_nodes`), and the ops an attention, a norm or a quantized
    MatMul left unfused, with where (`left_over`)."""
    report, before = Report(), census(model)
    moved = sort_nodes(model)  # first: the rules match in topological order
    if moved:
        report.notes.append(f"sorted the nodes into topological order: {moved} came before the node making an "
                            "input of theirs (onnxruntime loads such graphs, as onnxruntime's float16 converter "
                            "writes them with keep_io_types; onnx and the rules need the order)")
    run(model, steps, report, flags)
    out = report.as_dict()
    out.update(sorted_nodes=moved, nodes_before=sum(before.values()), nodes_after=len(model.graph),
               ops_before=before, ops_after=census(model), left_over=left_over(model.graph))
    return out

"""opset 23's standard RMSNormalization -> SimplifiedLayerNormalization, the op onnxruntime-web's WebGPU EP
runs fused (and the residual fold, skip_rms_norm, and GQA's Q/K norms look for). The same computation:
x / sqrt(mean(x^2 over the axes from `axis` on) + epsilon) * scale, statistics in fp32 (stash_type 1)."""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from webbuild.fusion.rule import Miss, Rule
from webbuild.graph.ir import attr, producer_of, replace


@dataclass
class _Match:
    node: ir.Node


def match(n: ir.Node) -> _Match | Miss | None:
    x = n.inputs[0]
    rank = len(x.shape) if x is not None and x.shape is not None else None
    if attr(n, "axis", -1) not in (-1, *([rank - 1] if rank else [])):
        return Miss("RMSNormalization over more than the last axis")
    if attr(n, "stash_type", 1) != 1:
        return Miss("RMSNormalization with statistics in a type other than fp32")
    return _Match(n)


def _rewrite(g: ir.Graph, m: _Match) -> None:
    n = m.node
    node = ir.node("SimplifiedLayerNormalization", list(n.inputs[:2]),
                   {"axis": -1, "epsilon": float(attr(n, "epsilon", 1e-5)), "stash_type": 1},
                   name=f"{n.name or 'RMSNormalization'}/Simplified")
    out = n.outputs[0]
    node.outputs[0].shape, node.outputs[0].type = out.shape, out.type
    g.insert_after(producer_of(out), node)
    replace(out, node.outputs[0])


RULE = Rule("rms_normalization", ("RMSNormalization",), match, _rewrite, domain="")

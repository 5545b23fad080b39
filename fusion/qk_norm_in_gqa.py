"""Opt-in (WebGPU/CUDA only): Q/K RMSNorm moved into GroupQueryAttention (q_norm_weight /
k_norm_weight, inputs 14/15, attribute qk_norm_epsilon), as the genai builder emits for `-e webgpu`.

Removes 2 SimplifiedLayerNormalization + 4 Reshape per layer. onnxruntime's CPU GQA rejects these
inputs, so graphs fused this way cannot be checked against the source on CPU; the default
keeps the norms explicit.
"""

from __future__ import annotations

import onnx_ir as ir

from fusion._ir import attr, prod
from fusion.report import Report

RULE = "qk_norm_in_gqa"
_Q_NORM, _K_NORM = 14, 15


def apply(model: ir.Model, report: Report) -> int:
    done = 0
    for gqa in [n for n in model.graph if n.op_type == "GroupQueryAttention"]:
        if len(gqa.inputs) > _Q_NORM and gqa.inputs[_Q_NORM] is not None:
            continue  # already inside
        norms = [head_norm(gqa.inputs[slot]) for slot in (0, 1)]
        if None in norms:
            continue  # no Q/K norm (Llama, Qwen2): nothing to move
        (xq, q), (xk, k) = norms
        eps = {attr(q, "epsilon"), attr(k, "epsilon")}
        if len(eps) != 1:
            report.miss(RULE, gqa.name or "GroupQueryAttention", "Q and K norms use different epsilons")
            continue
        _rewrite(gqa, xq, xk, q.inputs[1], k.inputs[1], eps.pop())
        done += 1
    report.hit(RULE, done) if done else None
    return done


def head_norm(v: ir.Value) -> tuple[ir.Value, ir.Node] | None:
    """v = Reshape(SimplifiedLayerNormalization(Reshape(x, [.., heads, hd])), [0, 0, -1]) -> (x, norm)."""
    flat = prod(v, "Reshape")
    norm = prod(flat.inputs[0], "SimplifiedLayerNormalization") if flat else None
    heads = prod(norm.inputs[0], "Reshape") if norm else None
    return (heads.inputs[0], norm) if heads is not None else None


def _rewrite(gqa: ir.Node, xq, xk, wq, wk, eps: float) -> None:
    if len(gqa.inputs) < 16:
        gqa.resize_inputs(16)  # inputs are positional: the weights go to slots 14 and 15
    for slot, v in ((0, xq), (1, xk), (_Q_NORM, wq), (_K_NORM, wk)):
        gqa.replace_input_with(slot, v)
    gqa.attributes["qk_norm_epsilon"] = ir.AttrFloat32("qk_norm_epsilon", eps)

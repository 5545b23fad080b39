"""Opt-in (WebGPU/CUDA only): Q/K RMSNorm moved into GroupQueryAttention (q_norm_weight /
k_norm_weight, inputs 14/15, attribute qk_norm_epsilon), as the genai builder emits for `-e webgpu`.

Removes 2 SimplifiedLayerNormalization + 4 Reshape per layer. onnxruntime's CPU GQA (and so
onnxruntime-web's wasm EP) rejects these inputs at run time; `take_out` is the exact inverse, for
those runtimes. fuse_decoder keeps the norms explicit by default (checkable on CPU); the build moves
them into GQA for the WebGPU decoders only (webbuild/forms/webgpu.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from webbuild.fusion.rule import Miss, Rule
from webbuild.fusion.rule_report import Report
from webbuild.graph.ir import attr, prod, shared_const

_Q_NORM, _K_NORM = 14, 15


@dataclass
class _Match:
    gqa: ir.Node
    q: tuple[ir.Value, ir.Node]  # (Q projection, its norm)
    k: tuple[ir.Value, ir.Node]
    epsilon: float


def carries_norms(gqa: ir.Node) -> bool:
    """Does the GroupQueryAttention hold Q/K norm weights (this rule's output, the genai builder's webgpu)?"""
    return len(gqa.inputs) > _Q_NORM and gqa.inputs[_Q_NORM] is not None


def match(gqa: ir.Node) -> _Match | Miss | None:
    if carries_norms(gqa):
        return None  # already inside
    q_norm, k_norm = (head_norm(gqa.inputs[slot]) for slot in (0, 1))
    if q_norm is None or k_norm is None:
        return None  # no Q/K norm (Llama, Qwen2): nothing to move
    eps = {attr(norm, "epsilon") for _, norm in (q_norm, k_norm)}
    if len(eps) != 1:
        return Miss("Q and K norms use different epsilons")
    return _Match(gqa, q_norm, k_norm, eps.pop())


def head_norm(v: ir.Value | None) -> tuple[ir.Value, ir.Node] | None:
    """v = Reshape(SimplifiedLayerNormalization(Reshape(x, [.., heads, hd])), [0, 0, -1]) -> (x, norm)."""
    flat = prod(v, "Reshape")
    norm = prod(flat.inputs[0], "SimplifiedLayerNormalization") if flat else None
    heads = prod(norm.inputs[0], "Reshape") if norm else None
    x = heads.inputs[0] if heads is not None else None
    return (x, norm) if x is not None and norm is not None else None


def _rewrite(g: ir.Graph, m: _Match) -> None:
    gqa, (xq, q), (xk, k) = m.gqa, m.q, m.k
    if len(gqa.inputs) < 16:
        gqa.resize_inputs(16)  # inputs are positional: the weights go to slots 14 and 15
    for slot, v in ((0, xq), (1, xk), (_Q_NORM, q.inputs[1]), (_K_NORM, k.inputs[1])):
        gqa.replace_input_with(slot, v)
    gqa.attributes["qk_norm_epsilon"] = ir.AttrFloat32("qk_norm_epsilon", m.epsilon)


RULE = Rule("qk_norm_in_gqa", ("GroupQueryAttention",), match, _rewrite)
apply = RULE.apply  # the build moves the norms into its WebGPU decoders' GQA with this


def take_out(model: ir.Model) -> int:
    """The inverse of `apply`: Reshape -> SimplifiedLayerNormalization -> Reshape before GQA's Q and K
    again, with the weights and epsilon GQA held. Returns how many GQA nodes changed."""
    return _TAKE_OUT.apply(model, Report())


def _norms_inside(gqa: ir.Node) -> ir.Node | None:
    """`gqa` when it holds both norm weights."""
    return gqa if len(gqa.inputs) > _K_NORM and gqa.inputs[_Q_NORM] is not None else None


def _take_out(g: ir.Graph, gqa: ir.Node) -> None:
    flat = shared_const(g, "qk_norm/flat", np.array([0, 0, -1], np.int64))
    eps = attr(gqa, "qk_norm_epsilon", 1e-6)
    for slot, w in ((0, gqa.inputs[_Q_NORM]), (1, gqa.inputs[_K_NORM])):
        assert w is not None and w.shape is not None, "a norm weight GQA holds (an initializer)"
        heads = shared_const(g, "qk_norm/heads", np.array([0, 0, -1, w.shape[0]], np.int64))
        split = ir.node("Reshape", [gqa.inputs[slot], heads], name=f"{gqa.name}/qk_norm{slot}/Reshape")
        norm = ir.node("SimplifiedLayerNormalization", [split.outputs[0], w],
                       {"axis": -1, "epsilon": eps, "stash_type": 1}, name=f"{gqa.name}/qk_norm{slot}")
        join = ir.node("Reshape", [norm.outputs[0], flat], name=f"{gqa.name}/qk_norm{slot}/Flatten")
        g.insert_before(gqa, [split, norm, join])
        gqa.replace_input_with(slot, join.outputs[0])
    for slot in (_Q_NORM, _K_NORM):
        gqa.replace_input_with(slot, None)
    gqa.resize_inputs(max(i for i, v in enumerate(gqa.inputs) if v is not None) + 1)
    gqa.attributes.pop("qk_norm_epsilon", None)


_TAKE_OUT = Rule("qk_norm_out_of_gqa", ("GroupQueryAttention",), _norms_inside, _take_out)

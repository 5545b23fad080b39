"""Q, K, V projections of one attention -> one packed MatMul (or MatMulNBits) + Split.

One dispatch reads the normed hidden state once instead of three times. With Q/K norms (per head, as
Qwen3's, or over the whole projection, as OLMo2's) GQA still needs Q and K apart, so a Split follows (as
in the genai builder's graph); without them GQA takes the packed tensor directly (key/value inputs empty)
and there is no Split.
Projection biases (Qwen2) are packed too. MatMulNBits projections pack when their quantization
attributes agree: blocks are per output row, so rows concatenate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from webbuild.fusion import qk_norm_in_gqa
from webbuild.fusion.rule import Miss, Rule
from webbuild.graph.ir import attr, const, const_input, import_ms_domain, new_const, prod, replace, shared_const

_NBITS_ATTRS = ("K", "bits", "block_size", "accuracy_level")


@dataclass
class _Unsplit:
    gqa: ir.Node
    packed: ir.Value  # the packed QKV tensor whose three parts (a Split's or Slices') feed GQA's Q, K, V directly


@dataclass
class _Pack:
    gqa: ir.Node
    projs: list  # (projection output, MatMul-like node, bias) for Q, K, V


def match(gqa: ir.Node) -> _Unsplit | _Pack | Miss | None:
    if gqa.inputs[1] is None:
        return None  # already packed
    split = _already_packed(gqa)
    if split is not None:
        # a GQA holding Q/K norm weights keeps its Split (the genai builder's webgpu graph): packed QKV with
        # norms inside is a form no test runs on the one EP that takes it (onnxruntime CPU refuses the norms)
        packed = split.inputs[0]
        if packed is None or not _unsplittable(gqa, split) or qk_norm_in_gqa.carries_norms(gqa):
            return None
        return _Unsplit(gqa, packed)
    sliced = _sliced(gqa)
    if sliced is not None:
        return _Unsplit(gqa, sliced)
    projs = [_projection(gqa, slot) for slot in range(3)]
    why = _why_not(projs)
    return Miss(why) if why else _Pack(gqa, projs)


def _rewrite(g: ir.Graph, m: _Unsplit | _Pack) -> None:
    if isinstance(m, _Unsplit):
        _unsplit(m.gqa, m.packed)
    else:
        _pack(g, m.gqa, m.projs)


def _already_packed(gqa: ir.Node) -> ir.Node | None:
    """The Split whose three outputs are Q, K, V (this rule's own output, or a packed source's)."""
    splits = []
    for slot in range(3):
        splits.append(prod(_under_norm(gqa.inputs[slot]), "Split"))
    same = splits[0] is not None and all(s is splits[0] for s in splits)
    return splits[0] if same else None


def _sliced(gqa: ir.Node) -> ir.Value | None:
    """The tensor whose last axis three Slices cut, back to back from 0 to the end, into the Q, K and V
    that GQA reads directly (a packed source without Q/K norms: Phi-3's qkv_proj)."""
    found = [prod(v, "Slice") for v in gqa.inputs[:3]]
    slices = [s for s in found if s is not None]
    if len(slices) != len(found) or any(len(s.inputs) < 4 or s.inputs[0] is not slices[0].inputs[0] for s in slices):
        return None
    bounds = [[_int(s, i) for i in (1, 2, 3)] + [_int(s, 4) if len(s.inputs) > 4 else 1] for s in slices]
    if any(axis not in (-1, 2) or step != 1 for *_, axis, step in bounds):
        return None
    (s0, e0, *_), (s1, e1, *_), (s2, e2, *_) = bounds
    contiguous = s0 == 0 and None not in (e0, e1) and (s1, s2) == (e0, e1)
    return slices[0].inputs[0] if contiguous and e2 is not None and e2 >= 2**62 else None


def _under_norm(v: ir.Value | None) -> ir.Value | None:
    """What a GQA input is normed from: a head-wise Q/K norm (Reshape to heads, norm, Reshape back: Qwen3) or
    one over the whole projection (OLMo2); `v` itself without a norm."""
    flat = prod(v, "Reshape")
    norm = prod(flat.inputs[0], "SimplifiedLayerNormalization") if flat else None
    heads = prod(norm.inputs[0], "Reshape") if norm else None
    if heads is not None:
        return heads.inputs[0]
    whole = prod(v, "SimplifiedLayerNormalization")
    return whole.inputs[0] if whole is not None else v


def _int(n: ir.Node, i: int) -> int | None:
    c = const(n.inputs[i])
    return int(c.reshape(-1)[0]) if c is not None and c.size == 1 else None


def _unsplittable(gqa: ir.Node, split: ir.Node) -> bool:
    return list(gqa.inputs[:3]) == list(split.outputs) and attr(split, "axis", 0) in (-1, 2)


def _unsplit(gqa: ir.Node, packed: ir.Value) -> None:
    """Without Q/K norms GQA unpacks QKV itself: feed it the packed tensor, drop the Split."""
    for slot, v in ((0, packed), (1, None), (2, None)):
        gqa.replace_input_with(slot, v)


def _projection(gqa: ir.Node, slot: int) -> tuple[ir.Value, ir.Node, ir.Value | None] | None:
    """(projection output, MatMul-like node, bias) feeding GQA input `slot`, through a Q/K norm."""
    v = _under_norm(gqa.inputs[slot])
    add = prod(v, "Add")
    bias = next((x for x in add.inputs if const(x) is not None), None) if add else None
    mm = prod(next(x for x in add.inputs if x is not bias) if add and bias is not None else v, "MatMul", "MatMulNBits")
    return (v, mm, bias) if mm is not None and v is not None else None


def _why_not(projs) -> str | None:
    if any(p is None for p in projs):
        return "a projection is not a MatMul / MatMulNBits"
    nodes = [p[1] for p in projs]
    if len({id(n.inputs[0]) for n in nodes}) != 1:
        return "projections read different inputs"
    if len({n.op_type for n in nodes}) != 1:
        return "mixed MatMul and MatMulNBits projections"
    if nodes[0].op_type == "MatMul" and not all(_constant_matrix(n.inputs[1]) for n in nodes):
        return "a projection weight is not a constant matrix"
    if nodes[0].op_type == "MatMulNBits" and not _nbits_compatible(nodes):
        return "MatMulNBits projections differ in quantization"
    if len({p[2] is None for p in projs}) != 1:
        return "only some projections have a bias"
    if any(len(list(p[0].consumers())) != 1 or p[0].is_graph_output() for p in projs):
        return "a projection output has other users"
    return None


def _constant_matrix(v: ir.Value) -> bool:
    w = const(v)
    return w is not None and w.ndim == 2


def _nbits_compatible(nodes: list[ir.Node]) -> bool:
    first = nodes[0]
    same = all(attr(n, a) == attr(first, a) for n in nodes for a in _NBITS_ATTRS)
    simple = all(len([x for x in n.inputs[4:] if x is not None]) == 0 for n in nodes)  # no g_idx / bias
    arity = len({len([x for x in n.inputs[:4] if x is not None]) for n in nodes}) == 1
    consts = all(const(x) is not None for n in nodes for x in n.inputs[1:4] if x is not None)
    return same and simple and arity and consts


def _pack(g: ir.Graph, gqa: ir.Node, projs) -> None:
    import_ms_domain(g)
    outs, nodes, biases = zip(*projs)
    widths = [_out_width(n) for n in nodes]
    name = (gqa.name or "attn") + "/qkv_proj"
    new: list[ir.Node] = []
    mm = _packed_matmul(g, nodes, name)
    new.append(mm)
    packed = mm.outputs[0]
    if biases[0] is not None:
        b = new_const(g, name + ".bias", np.concatenate([const(x) for x in biases]))
        new.append(ir.node("Add", [packed, b], name=name + "/Add"))
        packed = new[-1].outputs[0]
    packed.type = outs[0].type  # shape: sum of widths, left to inference
    if all(gqa.inputs[i] is outs[i] for i in range(3)):  # no Q/K norm: GQA unpacks itself
        g.insert_before(gqa, new)
        for slot, v in ((0, packed), (1, None), (2, None)):
            gqa.replace_input_with(slot, v)
        return
    sizes = shared_const(g, "qkv/split_" + "_".join(map(str, widths)), np.array(widths, np.int64))
    split = ir.node("Split", [packed, sizes], {"axis": -1}, num_outputs=3, name=name + "/Split")
    new.append(split)
    g.insert_after(nodes[-1], new)
    for old, part in zip(outs, split.outputs):
        part.type, part.shape = old.type, old.shape
        replace(old, part)


def _out_width(n: ir.Node) -> int:
    return int(attr(n, "N")) if n.op_type == "MatMulNBits" else int(const_input(n, 1).shape[1])


def _packed_matmul(g: ir.Graph, nodes, name: str) -> ir.Node:
    h = nodes[0].inputs[0]
    if nodes[0].op_type == "MatMul":
        w = new_const(g, name + ".weight", np.concatenate([const(n.inputs[1]) for n in nodes], axis=1))
        return ir.node("MatMul", [h, w], name=name + "/MatMul")
    arity = min(len(nodes[0].inputs), 4)
    packed = [new_const(g, f"{name}.{i}", np.concatenate([const(n.inputs[i]) for n in nodes], axis=0))
              if nodes[0].inputs[i] is not None else None for i in range(1, arity)]
    attrs = {a: attr(nodes[0], a) for a in _NBITS_ATTRS}
    attrs["N"] = sum(int(attr(n, "N")) for n in nodes)
    while packed and packed[-1] is None:
        packed.pop()
    return ir.node("MatMulNBits", [h, *packed], attrs, domain="com.microsoft", name=name + "/MatMulNBits")


RULE: Rule[_Unsplit | _Pack] = Rule("packed_qkv", ("GroupQueryAttention",), match, _rewrite)

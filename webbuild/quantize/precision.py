"""fp32 -> fp16 variant: fp16 graph I/O and weights, fp32 where fp16 overflows or loses positions.

onnxruntime.transformers.float16 does the conversion (casts at every fp32/fp16 border, initializers
consumed by fp16 nodes halved, MatMulNBits / GatherBlockQuantized scales included, so their outputs
are fp16). We only choose what stays fp32:
- decomposed RMSNorm statistics: Pow -> ReduceMean -> Add(eps) -> Sqrt -> Div/Reciprocal (x^2 and its
  mean overflow fp16 once |x| > 256);
- Softmax (decomposed attention);
- the rotary angles: every ancestor of Cos/Sin (positions beyond 2048 are not integers in fp16).
Fused graphs need none of this: SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization keep
their statistics in fp32 (stash_type=1) and GroupQueryAttention holds fp16 cos/sin caches of
fp32-computed angles.
"""

from __future__ import annotations

import onnx
from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

FP32_OPS = ["Softmax", "Pow", "ReduceMean", "Sqrt", "Reciprocal", "Cos", "Sin"]
_NORM_TAIL = {"ReduceMean": ("Add",), "Sqrt": ("Div", "Reciprocal")}


def name_nodes(model: onnx.ModelProto) -> None:
    """node_block_list works by name; give unnamed nodes unique ones."""
    seen = {n.name for n in model.graph.node if n.name}
    for i, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"_n{i}_{node.op_type}"
            while node.name in seen:
                node.name += "_"
            seen.add(node.name)


def fp32_nodes(model: onnx.ModelProto, extra_prefixes: tuple[str, ...] = ()) -> list[str]:
    """Names of the nodes kept in fp32 beyond FP32_OPS (see module doc)."""
    nodes = list(model.graph.node)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    producer = {o: n for n in nodes for o in n.output}
    for n in nodes:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    keep = [c.name for n in nodes if n.op_type in _NORM_TAIL
            for o in n.output for c in consumers.get(o, []) if c.op_type in _NORM_TAIL[n.op_type]]
    keep += _ancestors([n for n in nodes if n.op_type in ("Cos", "Sin")], producer)
    keep += [n.name for n in nodes if any(o.startswith(extra_prefixes) for o in n.output)] if extra_prefixes else []
    return keep


def _ancestors(roots, producer) -> list[str]:
    """Producers feeding `roots`, stopping at Shape (its input's dtype does not matter)."""
    seen, stack = set(), list(roots)
    while stack:
        node = stack.pop()
        for name in node.input:
            p = producer.get(name)
            if p is not None and p.name not in seen and p.op_type != "Shape":
                seen.add(p.name)
                stack.append(p)
    return sorted(seen)


def to_fp16(model: onnx.ModelProto, keep_io: bool | list[str] = False,
            extra_fp32_prefixes: tuple[str, ...] = ()) -> onnx.ModelProto:
    """The fp16 variant of `model`; `keep_io` = True or a list of graph I/O names left fp32."""
    name_nodes(model)
    out = convert_float_to_float16(
        model, keep_io_types=keep_io, op_block_list=DEFAULT_OP_BLOCK_LIST + FP32_OPS,
        node_block_list=fp32_nodes(model, extra_fp32_prefixes), disable_shape_infer=False)
    drop_round_trips(out)
    return out


def drop_round_trips(model: onnx.ModelProto) -> int:
    """Cast(fp32->fp16) -> Cast(fp16->fp32) pairs: read the fp32 value directly.

    The converter routes a value between two fp32 nodes through fp16 (it retypes the value itself),
    which would bring back the overflow the block list avoids. Returns how many pairs were bypassed.
    """
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    to = lambda n: next((a.i for a in n.attribute if a.name == "to"), None)  # noqa: E731
    rename = {}
    for n in g.node:
        src = producer.get(n.input[0]) if n.op_type == "Cast" else None
        # only the converter's own casts: it renames a blocked node's fp32 output to "<name>_cast_to_fp16";
        # an exported Cast(to=FLOAT) it retyped to fp16 reads an fp16 value and must stay
        if (src is not None and src.op_type == "Cast" and to(n) == onnx.TensorProto.FLOAT
                and to(src) == onnx.TensorProto.FLOAT16 and src.input[0].endswith("_cast_to_fp16")
                and n.output[0] not in {o.name for o in g.output}):
            rename[n.output[0]] = src.input[0]
    for n in g.node:
        n.input[:] = [rename.get(i, i) for i in n.input]
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    keep = [n for n in g.node if n.op_type != "Cast" or any(o in used for o in n.output)]
    del g.node[:]
    g.node.extend(keep)
    if rename:  # the converter's value_info typed some of these values fp16; onnxruntime re-infers them
        del g.value_info[:]
    return len(rename)

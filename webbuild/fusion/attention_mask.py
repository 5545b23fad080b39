"""attention_mask [B, T] int64 -> GroupQueryAttention's seqlens_k (per-batch length - 1, int32) and
total_sequence_length (T, int32 scalar); built once per graph, as the genai builder does."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from webbuild.graph.ir import shared_const

NAME = "attention_mask"
_SEQLENS, _TOTAL = "attn_mask/seqlens_k", "attn_mask/total_sequence_length"


def mask_input(graph: ir.Graph) -> ir.Value:
    """The graph's `attention_mask` input, added (at position 1) when the source has none."""
    for v in graph.inputs:
        if v.name == NAME:
            return v
    v = ir.Value(name=NAME, shape=ir.Shape(["batch_size", "total_sequence_length"]),
                 type=ir.TensorType(ir.DataType.INT64))
    graph.inputs.insert(min(1, len(graph.inputs)), v)
    return v


def gqa_lengths(graph: ir.Graph) -> tuple[ir.Value, ir.Value]:
    """(seqlens_k, total_sequence_length), reusing the subgraph when an earlier layer made it."""
    found = {o.name: o for n in graph for o in n.outputs if o.name in (_SEQLENS, _TOTAL)}
    if len(found) == 2:
        return found[_SEQLENS], found[_TOTAL]
    mask = mask_input(graph)
    one = shared_const(graph, "attn_mask/one", np.array([1], np.int64))
    nodes = [ir.node("ReduceSum", [mask, one], {"keepdims": 0}, name="attn_mask/ReduceSum")]
    nodes.append(ir.node("Sub", [nodes[-1].outputs[0], one], name="attn_mask/Sub"))
    nodes.append(ir.node("Cast", [nodes[-1].outputs[0]], {"to": ir.DataType.INT32}, name="attn_mask/CastSeqlens"))
    seqlens = nodes[-1].outputs[0]
    nodes.append(ir.node("Shape", [mask], {"start": 1, "end": 2}, name="attn_mask/Shape"))
    nodes.append(ir.node("Squeeze", [nodes[-1].outputs[0]], name="attn_mask/Squeeze"))
    nodes.append(ir.node("Cast", [nodes[-1].outputs[0]], {"to": ir.DataType.INT32}, name="attn_mask/CastTotal"))
    total = nodes[-1].outputs[0]
    seqlens.name, total.name = _SEQLENS, _TOTAL
    seqlens.type = total.type = ir.TensorType(ir.DataType.INT32)
    seqlens.shape, total.shape = ir.Shape(["batch_size"]), ir.Shape([])
    graph.insert_before(graph.node(0), nodes) if len(graph) else graph.extend(nodes)
    return seqlens, total

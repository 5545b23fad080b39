"""The decode-step form of a built WebGPU decoder: one token in, every node on the WebGPU EP, so
onnxruntime-web can capture the step once and replay it (docs/graph-capture.md).

What keeps the shipped decoder off graph capture is int64 shape arithmetic that onnxruntime puts on
its CPU EP; the step form has none:

- the audio splice (ScatterND of `audio_features` over the text embeddings, its row indices computed
  from `audio_offset` and shapes) is gone with both inputs: a decode step has no audio;
- GroupQueryAttention's lengths come from the mask's values on the GPU, as the onnxruntime-genai
  builder's graph-capture form does: Cast(int32) -> ReduceSum -> Sub 1 gives `seqlens_k`, ReduceMax
  of the sum gives `total_sequence_length`. Shape(attention_mask) would be the CPU EP's.

The runtime feeds it a static KV cache: `attention_mask` [1, T_max] with ones up to the current
position, and every `past_key_values.*` bound to the same [1, kv, T_max, hd] buffer as its `present.*`
(GroupQueryAttention appends in place). The weights file is the decoder's: the form adds a few KB.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from webbuild.graph.ir import dead_code_elimination, shared_const

AUDIO_INPUTS = ("audio_features", "audio_offset")  # the decoder's splice inputs (webbuild.quantize.embeddings)
MASK, IDS = "attention_mask", "input_ids"
_SEQLENS, _TOTAL = 5, 6  # GroupQueryAttention's inputs


def step_form(model: ir.Model) -> bool:
    """Rewrite `model` in place; False when it is not a decoder this form applies to (no
    GroupQueryAttention, no attention_mask input, or embeddings in rather than token ids)."""
    graph = model.graph
    gqa = [n for n in graph.all_nodes() if n.op_type == "GroupQueryAttention"]
    names = {v.name: v for v in graph.inputs}
    mask = names.get(MASK)
    if not gqa or mask is None or IDS not in names:
        return False
    _drop_audio_splice(model)
    seqlens, total = _lengths_on_gpu(graph, mask)
    for node in gqa:
        node.replace_input_with(_SEQLENS, seqlens)
        node.replace_input_with(_TOTAL, total)
    return True


def _drop_audio_splice(model: ir.Model) -> None:
    """The splice's output becomes the text embeddings it was written over; the audio inputs go."""
    graph = model.graph
    audio = [v for v in graph.inputs if v.name in AUDIO_INPUTS]
    for v in audio:
        for node, _ in list(v.uses()):
            if node.op_type == "ScatterND":
                ir.convenience.replace_all_uses_with(node.outputs[0], node.inputs[0])
    dead_code_elimination(model)  # the splice's index arithmetic, which still reads the inputs' shapes
    for v in audio:
        graph.inputs.remove(v)
        if v.uses():  # a use other than a splice: the graph needs the audio after all
            raise ValueError(f"the decoder uses input {v.name!r} outside its audio splice")


def _lengths_on_gpu(graph: ir.Graph, mask: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(seqlens_k [B] int32, total_sequence_length [] int32) from the mask's values."""
    axis = shared_const(graph, "step/axis1", np.array([1], np.int64))
    one = shared_const(graph, "step/one_i32", np.array([1], np.int32))
    cast = ir.node("Cast", [mask], {"to": ir.DataType.INT32}, name="step/mask_i32")
    count = ir.node("ReduceSum", [cast.outputs[0], axis], {"keepdims": 0}, name="step/count")
    seqlens = ir.node("Sub", [count.outputs[0], one], name="step/seqlens_k")
    total = ir.node("ReduceMax", [count.outputs[0]], {"keepdims": 0}, name="step/total_sequence_length")
    for node, shape in ((cast, mask.shape), (count, ir.Shape(["batch_size"])), (seqlens, ir.Shape(["batch_size"])),
                        (total, ir.Shape([]))):
        node.outputs[0].type = ir.TensorType(ir.DataType.INT32)
        node.outputs[0].shape = shape
    graph.insert_before(graph.node(0), [cast, count, seqlens, total])
    return seqlens.outputs[0], total.outputs[0]

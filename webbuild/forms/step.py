"""The decode-step form of a built WebGPU decoder: one token in, every node on the WebGPU EP, so
onnxruntime-web can capture the step once and replay it (docs/graph-capture.md).

What keeps the shipped decoder off graph capture is int64 shape arithmetic that onnxruntime puts on
its CPU EP; the step form has none:

- the audio splice (ScatterND of `audio_features` over the text embeddings, its row indices computed
  from `audio_offset` and shapes) is gone with both inputs: a decode step has no audio;
- GroupQueryAttention's lengths come from the mask's values on the GPU, as the onnxruntime-genai
  builder's graph-capture form does: Cast(int32) -> ReduceSum -> Sub 1 gives `seqlens_k`, ReduceMax
  of the sum gives `total_sequence_length`. Shape(attention_mask) would be the CPU EP's.

- greedy decoding's choice is made on the GPU: the logits output gives way to `next_token` (int32
  [1, 1], the first maximum as numpy's argmax) and `margin` (float32 [1, 1], the chosen logit minus
  the runner-up's), and `input_ids` becomes int32 [1, 1], so the runtime binds `input_ids` and
  `next_token` to one buffer: each replay reads the token the previous one chose, the CPU never has to
  hand it back, and the runtime can queue the next step before this one's 12 bytes are read back.
  Both reductions run in two stages over the vocabulary as [rows, 128] (padded with -inf), since a
  one-stage reduction over ~150k logits is one slow workgroup on WebGPU;
- the last-position Slice before lm_head goes: a decode step has one position.
- in an adapted decoder (webbuild.forms.lora), gate's and up's updates become their
  MatMulNBits' bias: one row, so onnxruntime-web fuses the MLP again (lora.mlp_updates_as_biases);
  q, k and v become one packed MatMulNBits beside their down as a 4-bit MatMulNBits, both reading the layer's
  norm, then one update for the three and a Split (lora.packed_updates; lora.spare_readers, after the
  last dead-code elimination, makes the norm's readers the three that onnxruntime-web fuses into one kernel);
  o's and down's projections read their weights with their down's rows after them (one MatMulNBits), and an
  8-bit MatMulNBits of an identity over the projection's part and the up over the down's adds the update
  (lora.joint_downs); gate's and up's biases become 4-bit MatMulNBits of their merged updates (down @ up,
  which the page makes at a switch: lora.merged_deltas, webbuild.forms.lora_delta) on their norm copy,
  which spare_readers makes one fused kernel too; each other down MatMul becomes an 8-bit MatMulNBits reading the
  down's codes and scales as inputs (lora.quantized_downs).

The runtime feeds it a static KV cache: `attention_mask` [1, T_max] with ones up to the current
position, and every `past_key_values.*` bound to the same [1, kv, T_max, hd] buffer as its `present.*`
(GroupQueryAttention appends in place). The weights file is the decoder's: the form adds a few KB.
Every input and output name is webbuild.site.contract.IO's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from webbuild.forms.form import Form, Made, Miss, NotApplicable
from webbuild.forms.lora import adapted_step, spare_readers, step_layout
from webbuild.forms.step_attention import direct_attention
from webbuild.fusion.attention_mask import lengths_from_values
from webbuild.graph.builder import Builder
from webbuild.graph.files import rewrite_file
from webbuild.graph.ir import dead_code_elimination, prod
from webbuild.site.contract import IO

_SEQLENS, _TOTAL = 5, 6  # GroupQueryAttention's inputs
# the step's attention (model.yaml fusion.step_attention), the default first: written out with every kernel dispatched
# directly (webbuild.forms.step_attention), or onnxruntime's GroupQueryAttention
ATTENTIONS = ("direct", "gqa")
_ROW = 128  # the vocabulary as [rows, _ROW] for the two-stage reductions


def write_step(folder: Path, name: str, layout: dict[str, dict] | None = None,
               attention: str = ATTENTIONS[0]) -> Made | Miss:
    """Write the step form of the WebGPU decoder `folder/name` beside it as `<stem>.step.onnx` (same weights file),
    or say why not (`step_miss`). Its lora inputs' layout (an adapted decoder's: lora.step_layout) goes into
    `layout`; `attention` is ATTENTIONS' key."""
    dest = folder / f"{Path(name).stem}.step.onnx"
    why: list[Miss] = []
    left: list[Miss] = []

    def rewrite(model: ir.Model) -> bool:
        if miss := step_miss(model):
            why.append(miss)
            return False
        left.extend(step_form(model, attention))
        return True

    def finish(model: ir.Model) -> int:
        if layout is not None:
            layout.update(step_layout(model))
        return spare_readers(model)

    return Made(dest.name, tuple(left)) if rewrite_file(folder / name, dest, rewrite, finish=finish) else why[0]


def step_miss(model: ir.Model) -> Miss | None:
    """Why `model` has no step form, or None when it has one. A decoder without GroupQueryAttention (fusion left
    its attention: fusion reports that) or taking embeddings rather than token ids (quantize.method none: the page
    looks the tokens up itself) has none by design; one with GroupQueryAttention but no attention_mask input or
    no logits output loses it."""
    graph = model.graph
    names = {v.name for v in graph.inputs}
    if not any(n.op_type == "GroupQueryAttention" for n in graph.all_nodes()):
        return Miss("no GroupQueryAttention", loses=False)
    if IO.input_ids not in names:
        return Miss(f"no {IO.input_ids} input (the decoder takes embeddings)", loses=False)
    if IO.attention_mask not in names or not any(v.name == IO.logits for v in graph.outputs):
        return Miss(f"no {IO.attention_mask} input or no {IO.logits} output")
    return None


def step_form(model: ir.Model, attention: str = ATTENTIONS[0]) -> list[Miss]:
    """Rewrite `model`, a decoder `step_miss` passes, in place, its attention as `attention` says (ATTENTIONS);
    NotApplicable where its audio inputs are used outside the splice or its logits have no static vocabulary size.
    Returns the adapted passes' misses (lora.adapted_step: none for a base decoder)."""
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, not {attention!r}")
    graph = model.graph
    gqa = [n for n in graph.all_nodes() if n.op_type == "GroupQueryAttention"]
    names = {v.name: v for v in graph.inputs}
    mask = names[IO.attention_mask]
    logits = next(v for v in graph.outputs if v.name == IO.logits)
    _drop_audio_splice(model)
    seqlens, total = lengths_from_values(graph, mask, "step")
    for node in gqa:
        node.replace_input_with(_SEQLENS, seqlens)
        node.replace_input_with(_TOTAL, total)
    _drop_last_position_slice(logits)
    _greedy_on_gpu(graph, logits, model.opset_imports.get("", 17))
    ids = names[IO.input_ids]
    ids.type = ir.TensorType(ir.DataType.INT32)  # the embedding lookup takes int32 indices as well
    ids.shape = ir.Shape([1, 1])
    # an adapted decoder's passes: one row, so gate's and up's updates can be biases, q, k and v's one packed
    # projection with its 4-bit down beside it, o's and down's joined to their downs, gate's and up's biases their
    # merged updates, the other downs MatMulNBits' one-row decode kernel
    left = adapted_step(model)
    if attention == "direct":
        direct_attention(graph, mask, seqlens)
    return left


def _drop_audio_splice(model: ir.Model) -> None:
    """The splice's output becomes the text embeddings it was written over; the audio inputs go."""
    graph = model.graph
    audio = [v for v in graph.inputs if v.name in (IO.audio_features, IO.audio_offset)]  # the splice's
    for v in audio:
        for node, _ in list(v.uses()):
            if node.op_type == "ScatterND" and node.inputs[0] is not None:
                ir.convenience.replace_all_uses_with(node.outputs[0], node.inputs[0])
    dead_code_elimination(model)  # the splice's index arithmetic, which still reads the inputs' shapes
    for v in audio:
        graph.inputs.remove(v)
        if v.uses():  # a use other than a splice: the graph needs the audio after all
            raise NotApplicable(f"the decoder uses input {v.name!r} outside its audio splice")


def _drop_last_position_slice(logits: ir.Value) -> None:
    """lm_head's input sliced to the last position (the pruned decoder's Slice) is that input already."""
    head = logits.producer()
    src = prod(head.inputs[0]) if head is not None else None
    if head is not None and src is not None and src.op_type == "Slice" and _is_last_position(src):
        head.replace_input_with(0, src.inputs[0])


def _is_last_position(node: ir.Node) -> bool:
    """Slice(x, starts=[-1], ends=[big], axes=[1]): the sequence axis' last position."""
    consts = [v.const_value.numpy().tolist() if v is not None and v.const_value is not None else None
              for v in node.inputs[1:4]]
    return len(consts) == 3 and consts[0] == [-1] and consts[2] == [1] and (consts[1] or [0])[0] >= 2**31 - 1


def _greedy_on_gpu(graph: ir.Graph, logits: ir.Value, opset: int) -> None:
    """Replace the `logits` output with `next_token` and `margin` (see the module docstring)."""
    vocab = logits.shape[-1] if logits.shape is not None else None
    if not isinstance(vocab, int):
        raise NotApplicable("the decoder's logits have no static vocabulary size")
    rows = -(-vocab // _ROW)
    b, f32 = Builder(graph, "greedy/"), ir.DataType.FLOAT
    cast = logits if logits.dtype == f32 else b.op("Cast", [logits], f32, logits.shape, to=f32)
    x = b.op("Reshape", [cast, b.const("flat", np.array([-1], np.int64))], f32, (vocab,))
    size, grid, flag = rows * _ROW, (rows, _ROW), ir.DataType.BOOL
    neg = b.const("neg", np.array(-np.inf, np.float32))
    if size > vocab:
        x = b.op("Pad", [x, b.const("pads", np.array([0, size - vocab], np.int64)), neg], f32, (size,))
    shape = b.const("grid", np.array(grid, np.int64))
    x = b.op("Reshape", [x, shape], f32, grid)
    # 0..size-1 from constants (onnxruntime folds it when the session is made: nothing to download)
    count = [b.const(name, np.array(v, np.float32)) for name, v in (("zero", 0), ("size", size), ("one", 1))]
    index = b.op("Reshape", [b.op("Range", count, f32, (size,)), shape], f32, grid)
    best = _reduce(b, "ReduceMax", x, opset)
    first = _reduce(b, "ReduceMin", b.op("Where", [b.op("Equal", [x, best], flag, grid), index, count[1]], f32, grid),
                    opset)
    others = b.op("Where", [b.op("Equal", [index, first], flag, grid), neg, x], f32, grid)  # all but the chosen one
    margin = b.op("Sub", [best, _reduce(b, "ReduceMax", others, opset)], f32, (1, 1), output=IO.margin)
    # [1, 1] as computed, never reshaped: a Reshape output aliases its input, and graph capture would not
    # copy it into the buffer bound to next_token (input_ids' own)
    token = b.op("Cast", [first], ir.DataType.INT32, (1, 1), output=IO.next_token, to=ir.DataType.INT32)
    b.place()
    graph.outputs.remove(logits)
    graph.outputs.extend([token, margin])


def _reduce(b: Builder, op: str, x: ir.Value, opset: int) -> ir.Value:
    """[rows, cols] -> [1, 1]: per row, then across the rows, each over the last axis (onnxruntime's WebGPU
    reductions transpose first over any other axis: one more dispatch). ReduceMax / ReduceMin take their axes as an
    input from opset 18, as an attribute before."""
    assert x.shape is not None and x.dtype is not None, "the builder's values are declared"
    attrs: dict[str, Any] = {} if opset >= 18 else {"axes": [1]}
    axes = [b.const("axis1", np.array([1], np.int64))] if opset >= 18 else []
    per_row = b.op(op, [x, *axes], x.dtype, (x.shape[0],), keepdims=0, **attrs)
    row = b.op("Reshape", [per_row, b.const("as_row", np.array([1, -1], np.int64))], x.dtype, (1, x.shape[0]))
    return b.op(op, [row, *axes], x.dtype, (1, 1), keepdims=1, **attrs)


STEP = Form("step", "a WebGPU decoder with GroupQueryAttention taking token ids: one token a step, every node on "
            "the GPU, for graph capture", write_step)


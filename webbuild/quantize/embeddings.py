"""Give the decoder an `input_ids` path with an int4 embedding lookup, so no float table ships.

The graph's `inputs_embeds` input is replaced by three inputs:
  input_ids [B, S] int64, audio_features [B, A, H] (graph float type), audio_offset [1] int64
and the embeddings are GatherBlockQuantized(input_ids) with rows offset .. offset+A-1 taken from
audio_features (A may be 0: decode steps pass an empty [B, 0, H]). `audio_offset` indexes this call's
input_ids, and every audio row must land inside them.

Tied embeddings (Qwen3 ties embed_tokens and lm_head): the lm_head MatMulNBits weight B is uint8
[V, H/block, block*bits/8], codes along H, low nibble first, symmetric (default zero point 8, or 128
for 8-bit). GatherBlockQuantized reads uint8 data with the same conventions, so the *same initializer*
serves both: gather_axis=0, quantize_axis=2 (the block axis; the kernels reinterpret the uint8 last
axis as 2 x 4-bit), block_size=block. Its scales must have data's rank, [V, H/block, 1]; they are a
Reshape of lm_head's [V, H/block] scales (folded at session creation), so the file stores them once.
Untied tables, asymmetric or HQQ lm_heads are quantized separately (RTN symmetric) for the lookup.
"""

from __future__ import annotations

from typing import TypeGuard

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from webbuild.graph.packing import LOOKUP_ATTRS, dequantize, lookup_scales_shape
from webbuild.quantize.quantize_matmuls import MS_DOMAIN, _attrs
from webbuild.quantize.requantize import block_quantize
from webbuild.site.contract import IO

P = "embed/"  # prefix of every name this transform adds


def lm_head_node(model: onnx.ModelProto, vocab: int, hidden: int) -> onnx.NodeProto | None:
    """The symmetric MatMulNBits projecting hidden -> vocab, if the graph has exactly that."""
    found = [n for n in model.graph.node if n.op_type == "MatMulNBits" and n.domain == MS_DOMAIN
             and _attrs(n)["N"] == vocab and _attrs(n)["K"] == hidden]
    return found[-1] if found else None


def _shares(node: onnx.NodeProto | None) -> TypeGuard[onnx.NodeProto]:
    return node is not None and (len(node.input) < 4 or not node.input[3])


def _initializer(model: onnx.ModelProto, name: str) -> np.ndarray:
    return numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == name))


def is_tied(model: onnx.ModelProto, node: onnx.NodeProto, table: np.ndarray, rows: int = 8192) -> bool:
    """Does lm_head's quantized weight approximate `table` (within its own quantization step)?
    Compared `rows` vocabulary rows at a time: a whole 1.7B table dequantized is several GB of temporaries."""
    a = _attrs(node)
    n = a["N"]
    packed = _initializer(model, node.input[1])
    scales = _initializer(model, node.input[2]).reshape(n, -1)
    step = float(np.abs(scales).max())
    for i in range(0, n, rows):
        j = min(i + rows, n)
        w = dequantize(packed[i:j], scales[i:j], None, a["K"], j - i, a["bits"], a["block_size"])
        if float(np.abs(w.T - table[i:j]).max()) > step:
            return False
    return True


def add_input_ids(model: onnx.ModelProto, table: np.ndarray, bits: int = 4, block_size: int = 32,
                  tied: bool | None = None) -> dict:
    """Replace `inputs_embeds` by input_ids + audio splice (see module doc); returns a small report."""
    embeds_in = next((i for i in model.graph.input if i.name == IO.inputs_embeds), None)
    if embeds_in is None:
        raise ValueError(f"the decoder has no {IO.inputs_embeds!r} input to replace")
    vocab, hidden = table.shape
    lm = lm_head_node(model, vocab, hidden)
    share = _shares(lm) and (tied if tied is not None else is_tied(model, lm, table))
    nodes: list[onnx.NodeProto] = []
    if share and lm is not None:  # it is when it shares
        a = _attrs(lm)
        data, bits, block_size = lm.input[1], a["bits"], a["block_size"]
        scales = _reshape_scales(model, nodes, lm.input[2], vocab, hidden, block_size)
    else:
        data, scales = _own_table(model, table, bits, block_size)
    text = _lookup(model, nodes, data, scales, bits, block_size, hidden)
    _splice(model, nodes, embeds_in, text, hidden)
    _prepend(model, nodes)
    _add_ms_opset(model)
    return {"tied_shared": share, "data": data, "bits": bits, "block_size": block_size}


def _reshape_scales(model, nodes, name, vocab, hidden, block_size) -> str:
    shape = lookup_scales_shape(vocab, hidden, block_size)
    model.graph.initializer.append(numpy_helper.from_array(np.array(shape, np.int64), P + "scales_shape"))
    nodes.append(helper.make_node("Reshape", [name, P + "scales_shape"], [P + "scales"], name=P + "ScalesReshape"))
    return P + "scales"


def _own_table(model, table, bits, block_size) -> tuple[str, str]:
    packed, scales = block_quantize(np.asarray(table, np.float32).T, bits, block_size)
    model.graph.initializer.extend([numpy_helper.from_array(packed, P + f"table_q{bits}"),
                                    numpy_helper.from_array(scales[..., None], P + "table_scales")])
    return P + f"table_q{bits}", P + "table_scales"


def _lookup(model, nodes, data, scales, bits, block_size, hidden) -> str:
    """GatherBlockQuantized -> [B, S, blocks, block] -> Reshape [B, S, H]."""
    model.graph.initializer.append(numpy_helper.from_array(np.array([0, 0, hidden], np.int64), P + "bsh"))
    nodes.extend([
        helper.make_node("GatherBlockQuantized", [data, IO.input_ids, scales], [P + "blocks"], name=P + "Lookup",
                         domain=MS_DOMAIN, bits=bits, block_size=block_size, **LOOKUP_ATTRS),
        helper.make_node("Reshape", [P + "blocks", P + "bsh"], [P + "text"], name=P + "LookupReshape"),
    ])
    return P + "text"


def _const(model, name, value) -> str:
    model.graph.initializer.append(numpy_helper.from_array(np.array(value, np.int64), P + name))
    return P + name


def _splice(model: onnx.ModelProto, nodes: list, embeds_in, text: str, hidden: int) -> None:
    """embeds = text with rows offset .. offset+A-1 replaced by audio_features (ScatterND).

    Every row of audio_features must fall inside this call's input_ids (callers pass only the rows of
    the current run). ScatterND may reuse the lookup's buffer in place, and with no audio (every
    decode step) its indices are empty, so a step pays no dispatch for the splice; the index
    arithmetic is int64 shape math that onnxruntime-web keeps on the CPU.
    """
    dims = embeds_in.type.tensor_type.shape.dim
    batch, seq = (d.dim_param or d.dim_value for d in dims[:2])
    elem = embeds_in.type.tensor_type.elem_type
    zero, one = _const(model, "zero", 0), _const(model, "one", 1)
    ax0, ax1, ax2 = _const(model, "ax0", [0]), _const(model, "ax1", [1]), _const(model, "ax2", [2])
    n = lambda op, ins, outs, **kw: helper.make_node(op, ins, [P + o for o in outs], name=P + outs[0], **kw)  # noqa: E731
    audio, offset = IO.audio_features, IO.audio_offset
    nodes.extend([
        n("Shape", [audio], ["ba"], start=0, end=2),  # [B, A]
        n("Shape", [audio], ["alen1"], start=1, end=2),
        n("Squeeze", [P + "alen1"], ["alen"]),
        n("Squeeze", [offset], ["off"]),
        n("Add", [P + "off", P + "alen"], ["end"]),
        n("Range", [P + "off", P + "end", one], ["rows"]),  # [A]: offset .. offset+A-1
        n("Shape", [audio], ["b1"], start=0, end=1),
        n("Squeeze", [P + "b1"], ["b"]),
        n("Range", [zero, P + "b", one], ["batch"]),  # [B]
        n("Unsqueeze", [P + "rows", ax0], ["rows_1a"]),
        n("Expand", [P + "rows_1a", P + "ba"], ["rows_ba"]),
        n("Unsqueeze", [P + "batch", ax1], ["batch_b1"]),
        n("Expand", [P + "batch_b1", P + "ba"], ["batch_ba"]),
        n("Unsqueeze", [P + "batch_ba", ax2], ["bi"]),
        n("Unsqueeze", [P + "rows_ba", ax2], ["ri"]),
        n("Concat", [P + "bi", P + "ri"], ["indices"], axis=2),  # [B, A, 2]: (batch, position)
        n("ScatterND", [text, P + "indices", audio], ["embeds"]),
    ])
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name == IO.inputs_embeds:
                node.input[i] = P + "embeds"
    idx = list(model.graph.input).index(embeds_in)
    model.graph.input.remove(embeds_in)
    new = [helper.make_tensor_value_info(IO.input_ids, TensorProto.INT64, [batch, seq]),
           helper.make_tensor_value_info(audio, elem, [batch, "audio_len", hidden]),
           helper.make_tensor_value_info(offset, TensorProto.INT64, [1])]
    for k, vi in enumerate(new):
        model.graph.input.insert(idx + k, vi)


def _prepend(model: onnx.ModelProto, nodes: list) -> None:
    """The new nodes read only graph inputs and initializers: first in the list keeps topological order."""
    old = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend([*nodes, *old])


def _add_ms_opset(model: onnx.ModelProto) -> None:
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))

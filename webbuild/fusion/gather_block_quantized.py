"""Blockwise-dequantized table + Gather -> com.microsoft.GatherBlockQuantized, the table kept packed.

The decomposed lookup `DequantizeLinear(table [V, H], scale, zero_point, axis=1, block_size) ->
Gather(indices, axis=0)` (and the other spellings of webbuild.fusion.dequant, blocked along H)
materialises the whole float table on every run. The rule gathers from the stored codes instead, in
the layout webbuild.quantize.embeddings emits (webbuild.graph.packing): data uint8 [V, H/bs, bs*bits/8]
(`LOOKUP_ATTRS`), scales [V, H/bs, 1], zero points one byte a block (omitted when all are the uint8
default 2^(bits-1)), then a Reshape of [..., H/bs, bs] to [..., H]. A table that is also dequantized
for something else (tied to lm_head) shares its packed bytes and scales with the MatMulNBits that
webbuild.fusion.matmul_nbits makes of lm_head (the scales through a Reshape, stored once).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from webbuild.fusion import dequant
from webbuild.fusion.rule import Miss, Rule
from webbuild.graph.builder import Builder
from webbuild.graph.ir import MS, attr, import_ms_domain, new_const, replace
from webbuild.graph.packing import LOOKUP_ATTRS, lookup_scales_shape


@dataclass
class _Match:
    gather: ir.Node
    table: dequant.Blocked


def match(gather: ir.Node) -> _Match | Miss | None:
    o = dequant.operand(gather.inputs[0])
    if not isinstance(o, dequant.Operand):
        return o
    b, where = o.blocked, o.where
    if o.transposed or b.axis != 1 or attr(gather, "axis", 0) != 0:
        return Miss("not rows gathered from a table blocked along its rows' length", where)
    if b.cols % b.block_size:
        return Miss(f"row length {b.cols} is not a multiple of the block size {b.block_size}", where)
    indices = gather.inputs[1]
    if indices is None or indices.shape is None:
        return Miss("indices of unknown rank (the lookup's output is reshaped per index axis)")
    why = dequant.unfit(b, "GatherBlockQuantized")
    return Miss(why, where) if why else _Match(gather, b)


def _rewrite(g: ir.Graph, m: _Match) -> None:
    import_ms_domain(g)
    b, gather = m.table, m.gather
    p = dequant.pack(g, b)
    at = Builder(g, f"{gather.name or 'Gather'}/")  # the nodes go before the Gather they replace
    shape = lookup_scales_shape(p.rows, p.k, p.block_size)
    if dequant.shared(b):  # tied: lm_head's MatMulNBits takes the same scales, [V, H/bs]
        scales, target = dequant.matmul_scales(g, p), new_const(g, "lookup_scales_shape", np.array(shape))
        scales = at.op("Reshape", [scales, target], name=f"{at.prefix}ScalesReshape")
    else:
        scales = new_const(g, f"{p.data.name}.lookup_scales", p.scale.reshape(shape))
    inputs = [p.data, gather.inputs[1], scales]
    if p.zero is not None:
        inputs.append(new_const(g, f"{p.data.name}.lookup_zero_points", p.zero.reshape(shape)))
    blocks = at.op("GatherBlockQuantized", inputs, name=f"{at.prefix}Lookup", domain=MS, bits=p.bits,
                   block_size=p.block_size, **LOOKUP_ATTRS)
    blocks.type = gather.outputs[0].type
    indices = gather.inputs[1]
    assert indices is not None and indices.shape is not None, "match checked the indices' rank"
    rank = len(indices.shape)
    target = new_const(g, "lookup_shape", np.array([0] * rank + [p.k]))
    out = at.op("Reshape", [blocks, target], name=f"{at.prefix}LookupReshape")
    g.insert_before(gather, at.nodes)
    out.type, out.shape = gather.outputs[0].type, gather.outputs[0].shape
    replace(gather.outputs[0], out)


RULE = Rule("gather_block_quantized", ("Gather",), match, _rewrite)

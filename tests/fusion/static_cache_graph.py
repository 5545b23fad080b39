"""A small hand-built decoder whose KV cache is static and written in place by ScatterND, the WebNN execution
provider's form: every `past_key_values.{i}.key|value` is a buffer [1, kv, L, hd] of fixed length L, the new
rows go in by ScatterND at positions past .. past + S - 1 (under layout Transposes), and the attention reads the
whole buffer, a mask spanning it hiding the slots not yet written.

`static_decoder(dims, **axes)`: inputs_embeds [1, S, hidden], attention_mask [1, L] (ones on the written slots,
the new ones included), (position_ids [1, S]), the buffers -> logits [1, S, vocab], present.{i}.key|value (the
buffers, written). RMSNorm, RoPE (rotate_half or interleaved), repeat_kv, a SiLU MLP, all decomposed; node and
inner value names random but each Softmax's, named for its layer as exporters name it (where a refusal is
reported). AXES lists each axis's spellings (the first the default), NEGATIVE the writes and masks
GroupQueryAttention does not compute: the rows written at a fixed offset, and a mask that hides the unwritten
slots but is not causal among the new positions. SHAPES: odd shapes (head sizes 16-80, 1-3 KV heads, hidden
sizes that are no power of two, buffers of odd lengths).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from onnx import TensorProto, helper

from tests.fusion.attention_graph import Builder, cos_sin, rotate


@dataclass(frozen=True)
class Dims:
    hidden: int = 80
    heads: int = 5
    kv: int = 1
    head_dim: int = 16
    layers: int = 2
    vocab: int = 96
    buffer: int = 37  # L, the static cache's length


SHAPES = {
    "h80-q5-kv1-hd16-L37": Dims(),
    "h72-q6-kv3-hd32-L29": Dims(hidden=72, heads=6, kv=3, head_dim=32, buffer=29),
    "h160-q4-kv2-hd48-L50": Dims(hidden=160, heads=4, kv=2, head_dim=48, buffer=50),
    "h120-q3-kv3-hd80-L33": Dims(hidden=120, heads=3, kv=3, head_dim=80, buffer=33),
    "h96-q4-kv2-hd24-L31": Dims(hidden=96, heads=4, kv=2, head_dim=24, buffer=31),  # RoPE kept: hd not 16k
}
AXES = {
    "write": ("time_major", "batch_major"),  # the buffer as [L, B, kv, hd] with [S, 1] indices, or [B, L, kv, hd]
    "past": ("mask", "position_ids"),  # where the written length comes from
    "mask": ("add", "bool"),
    "rope": ("half", "interleaved"),
    "cos_sin": ("computed", "cache"),
}
NEGATIVE = {"write": ("fixed_offset",), "mask": ("valid_only",)}
_EPS = 1e-6


def static_decoder(dims: Dims = Dims(), seed: int = 0, symbolic: bool = False, **axes) -> ir.Model:
    """The decoder with `axes` (AXES or NEGATIVE spellings; unnamed axes take their first spelling); `symbolic`:
    the buffers' length left symbolic in the graph's interface (fed dims.buffer long)."""
    ax = {k: v[0] for k, v in AXES.items()}
    if set(axes) - set(ax):
        raise ValueError(f"unknown axes {set(axes) - set(ax)}")
    ax.update(axes)
    b, w = Builder(seed), np.random.default_rng(seed + 1)
    d = dims

    def weight(rows: int, cols: int) -> str:
        return b.c(w.standard_normal((rows, cols)) / np.sqrt(rows), np.float32)

    seq = b.op("Gather", b.op("Shape", "inputs_embeds"), b.c(1), axis=0)
    if ax["past"] == "position_ids":
        past = b.op("Squeeze", b.op("Gather", "position_ids", b.c([0]), axis=1), b.c([0, 1]))
        pos = "position_ids"
        written = b.op("Reshape", "position_ids", b.c([-1]))
    else:  # the mask's ones (the written slots, the new ones included) less the new positions
        count = b.op("ReduceSum", "attention_mask", b.c([1]), keepdims=0)
        past = b.op("Sub", b.op("Squeeze", count, b.c([0])), seq)
        written = b.op("Range", past, b.op("Add", past, seq), b.c(1))
        pos = b.op("Unsqueeze", written, b.c([0]))
    if ax["write"] == "fixed_offset":  # rows written from slot 4 on, whatever the past
        written = b.op("Range", b.c(4), b.op("Add", b.c(4), seq), b.c(1))
    interleaved = ax["rope"] == "interleaved"
    cos4, sin4 = (b.op("Unsqueeze", t, b.c([1]))
                  for t in cos_sin(b, pos, d.head_dim, interleaved, ax["cos_sin"] == "cache", d.buffer))
    keep = _keep(b, past, seq, ax["mask"])

    h = "inputs_embeds"
    for i in range(d.layers):
        n = _rms(b, h, w, d.hidden)
        q, k, v = (b.op("MatMul", n, weight(d.hidden, width)) for width in
                   (d.heads * d.head_dim, d.kv * d.head_dim, d.kv * d.head_dim))
        qh, kh, vh = (b.op("Transpose", b.op("Reshape", t, b.c([0, 0, heads, d.head_dim])), perm=[0, 2, 1, 3])
                      for t, heads in ((q, d.heads), (k, d.kv), (v, d.kv)))
        q_rot, k_rot = (rotate(b, t, d.head_dim, interleaved, cos4, sin4) for t in (qh, kh))
        k_all, v_all = (_write(b, f"{i}.{name}", t, written, ax["write"])
                        for name, t in (("key", k_rot), ("value", vh)))
        k_rep, v_rep = (_repeat(b, t, d) for t in (k_all, v_all))
        scores = b.op("Mul", b.op("MatMul", q_rot, b.op("Transpose", k_rep, perm=[0, 1, 3, 2])),
                      b.c(d.head_dim ** -0.5, np.float32))
        if ax["mask"] == "bool":
            scores = b.op("Where", keep, scores, b.c(-np.inf, np.float32))
        else:
            scores = b.op("Add", scores, b.op("Where", keep, b.c(0.0, np.float32),
                                              b.c(np.finfo(np.float32).min, np.float32)))
        probs = b.op("Softmax", scores, axis=-1)
        b.nodes[-1].name = f"/model/layers.{i}/self_attn/Softmax"  # where a refusal is reported: as exporters name it
        att = b.op("MatMul", probs, v_rep)
        merged = b.op("Reshape", b.op("Transpose", att, perm=[0, 2, 1, 3]), b.c([0, 0, d.heads * d.head_dim]))
        h = b.op("Add", h, b.op("MatMul", merged, weight(d.heads * d.head_dim, d.hidden)))
        gate = b.op("MatMul", _rms(b, h, w, d.hidden), weight(d.hidden, 2 * d.hidden))
        h = b.op("Add", h, b.op("MatMul", b.op("Mul", gate, b.op("Sigmoid", gate)), weight(2 * d.hidden, d.hidden)))
    b.out("MatMul", "logits", _rms(b, h, w, d.hidden), weight(d.hidden, d.vocab))

    f, length = TensorProto.FLOAT, "buffer" if symbolic else d.buffer
    inputs = [helper.make_tensor_value_info("inputs_embeds", f, [1, "seq", d.hidden]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, length])]
    if ax["past"] == "position_ids":
        inputs.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "seq"]))
    buffers = [(i, n) for i in range(d.layers) for n in ("key", "value")]
    inputs += [helper.make_tensor_value_info(f"past_key_values.{i}.{n}", f, [1, d.kv, length, d.head_dim])
               for i, n in buffers]
    outputs = [helper.make_tensor_value_info("logits", f, [1, "seq", d.vocab])]
    outputs += [helper.make_tensor_value_info(f"present.{i}.{n}", f, [1, d.kv, length, d.head_dim])
                for i, n in buffers]
    g = helper.make_graph(b.nodes, "static_cache_decoder", inputs, outputs, b.inits)
    return ir.from_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))


def _write(b: Builder, name: str, rows: str, at: str, layout: str) -> str:
    """present.`name`: past_key_values.`name` with `rows` [1, kv, S, hd] written at the positions `at` [S]."""
    past = f"past_key_values.{name}"
    if layout == "batch_major":  # [B, L, kv, hd], indices (batch 0, position) [1, S, 2]
        pairs = b.op("Concat", b.op("Unsqueeze", b.op("Mul", at, b.c(0)), b.c([1])), b.op("Unsqueeze", at, b.c([1])),
                     axis=1)
        done = b.op("ScatterND", b.op("Transpose", past, perm=[0, 2, 1, 3]), b.op("Unsqueeze", pairs, b.c([0])),
                    b.op("Transpose", rows, perm=[0, 2, 1, 3]))
        return b.out("Transpose", f"present.{name}", done, perm=[0, 2, 1, 3])
    done = b.op("ScatterND", b.op("Transpose", past, perm=[2, 0, 1, 3]), b.op("Unsqueeze", at, b.c([1])),
                b.op("Transpose", rows, perm=[2, 0, 1, 3]))  # [L, B, kv, hd], indices [S, 1]
    return b.out("Transpose", f"present.{name}", done, perm=[1, 2, 0, 3])


def _repeat(b: Builder, t: str, d: Dims) -> str:
    if d.heads == d.kv:
        return t
    u = b.op("Expand", b.op("Unsqueeze", t, b.c([2])), b.c([1, 1, d.heads // d.kv, 1, 1]))
    return b.op("Reshape", u, b.c([0, d.heads, -1, d.head_dim]))


def _keep(b: Builder, past: str, seq: str, kind: str) -> str:
    """[1, 1, S, L]: which buffer slots each new position sees: the written ones up to its own."""
    slots = b.op("Unsqueeze", b.op("Range", b.c(0), b.op("Gather", b.op("Shape", "attention_mask"), b.c(1), axis=0),
                                   b.c(1)), b.c([0]))  # [1, L]
    written = b.op("Unsqueeze", b.op("Cast", "attention_mask", to=TensorProto.BOOL), b.c([1, 2]))  # [1, 1, 1, L]
    if kind == "valid_only":  # the written slots, the later new positions' included: not causal
        return written
    at = b.op("Unsqueeze", b.op("Range", past, b.op("Add", past, seq), b.c(1)), b.c([1]))  # [S, 1]
    return b.op("And", b.op("LessOrEqual", slots, at), written)


def _rms(b: Builder, x: str, w: np.random.Generator, width: int) -> str:
    ms = b.op("ReduceMean", b.op("Pow", x, b.c(2.0, np.float32)), b.c([-1]), keepdims=1)
    inv = b.op("Reciprocal", b.op("Sqrt", b.op("Add", ms, b.c(_EPS, np.float32))))
    return b.op("Mul", b.op("Mul", x, inv), b.c(1.0 + 0.1 * w.standard_normal(width), np.float32))

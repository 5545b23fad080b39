"""The attention mask, both ways: what the source's masks compute, and what GroupQueryAttention takes.

GQA masks causally itself, and takes the padding as seqlens_k (per-batch length - 1, int32) and
total_sequence_length (T, int32 scalar), made from `attention_mask` [B, T] int64 once per graph, as
the genai builder does. So a source mask may be dropped only when it is that causal mask: `causal_mask`
checks it by value, however it was spelt (an added 0 / min-float or -inf tensor, a boolean selecting
between the scores and a fill, from Where, Expand, And, Range and Slice chains, or from shapes
alone as SDPA's is_causal exports), by evaluating it on onnxruntime for probe inputs; a causal
sliding window (Mistral's) is found the same way, for GQA's local_window_size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from webbuild.graph.builder import Builder
from webbuild.site.contract import IO

_SEQLENS, _TOTAL = "attn_mask/seqlens_k", "attn_mask/total_sequence_length"
_STATIC = "attn_mask/static"  # the lengths of attentions over a static KV buffer (lengths_from_values)
MASKED = -1e4  # an additive mask entry at or below this hides its position (fp16's min is -65504)
_PAST, _NEW = 3, 2  # probe: 2 new positions after 3 cached ones


@dataclass(frozen=True)
class Mask:
    """One mask on the scores: `value` is added ("add"), or a boolean that keeps the scores where true
    ("keep": Where(m, scores, fill)) or where false ("drop": Where(m, fill, scores))."""
    value: ir.Value
    kind: str


def causal_window(masks: list[Mask], positions: int) -> int | str | None:
    """What the masks compute for a sequence that attends to all its positions, checked by value: None for
    the causal mask, W for a causal sliding window (each position sees the last W, its own included), or
    why neither. Probed with 2 new positions after 3 cached ones, then, for graphs with past inputs,
    after `positions` - 2, where a window shorter than the positions GQA can reach (its caches') shows."""
    if not masks:
        return "no mask on the scores: the attention is not causal"
    keep = _keep(masks, _PAST)
    if isinstance(keep, str):
        return keep
    window = _window(keep)
    if window is not None or keep.shape[-1] == _NEW or positions <= _PAST + _NEW:
        return window  # a window already, or a graph without past inputs (a prefill graph) sees only _NEW
    keep = _keep(masks, positions - _NEW)
    return keep if isinstance(keep, str) else _window(keep)


def _keep(masks: list[Mask], past: int) -> np.ndarray | str:
    """Which positions the masks together let each of _NEW new positions after `past` see: [.., _NEW, T]."""
    from webbuild.fusion import probe

    keep = _kept(masks, probe.decoder_feeds(past, _NEW))
    if isinstance(keep, str):
        return keep
    total = keep.shape[-1] if keep.ndim >= 2 else 0  # a graph without past inputs sees _NEW
    if keep.shape[-2:] != (_NEW, total) or total not in (_NEW, past + _NEW):
        return f"mask of shape {keep.shape} for {_NEW} new positions after {past}"
    return keep


def _kept(masks: list[Mask], feeds_for) -> np.ndarray | str:
    """What the masks together keep, evaluated for the probe inputs `feeds_for` (fusion.probe)."""
    from webbuild.fusion import probe

    got = probe.evaluate([m.value for m in masks], feeds_for)
    if isinstance(got, str):
        return f"mask not checked ({got})"
    keep: np.ndarray | None = None
    for m, value in zip(masks, got):
        if m.kind == "add":
            if not np.all((value <= MASKED) | (np.abs(value) < 1e-6)):
                return "the added mask holds values other than 0 and a large negative (a bias?)"
            k = value > MASKED
        else:
            k = value.astype(bool) if m.kind == "keep" else ~value.astype(bool)
        keep = k if keep is None else keep & k
    assert keep is not None, "called with one mask or more"
    return keep


def static_causal(masks: list[Mask], buffer: int) -> str | None:
    """None when the masks over a static KV buffer of `buffer` positions (the mask input as long, ones on the
    written slots) are what GroupQueryAttention applies over a shared buffer: each new position sees every
    written slot up to its own and nothing after it (slots not yet written hold stale values). Else why not.
    Probed at the buffer's start, after a few positions and at its end."""
    from webbuild.fusion import probe

    if not masks:
        return "no mask over the static KV buffer (its stale slots would be attended)"
    if buffer < _PAST + _NEW + 1:
        return f"a static KV buffer of {buffer} positions, too short to check"
    for past, n in ((0, _NEW + 1), (_PAST, _NEW), (buffer - _NEW, _NEW)):
        keep = _kept(masks, probe.decoder_feeds(past, n, buffer))
        if isinstance(keep, str):
            return keep
        if keep.ndim < 2 or keep.shape[-1] != buffer or keep.shape[-2] not in (1, n):
            return f"mask of shape {keep.shape} for {n} new positions over a static KV buffer of {buffer}"
        want = np.arange(buffer)[None] <= past + np.arange(n)[:, None]
        if not (np.broadcast_to(keep, (*keep.shape[:-2], n, buffer)) == want).all():
            return ("the mask over the static KV buffer is not the causal mask GroupQueryAttention applies "
                    "(each new position sees the written slots up to its own)")
    return None


def _window(keep: np.ndarray) -> int | str | None:
    """None when `keep` [.., _NEW, T] is causal, W when it is a causal window of W positions, else why not."""
    rows = keep.reshape(-1, _NEW, keep.shape[-1])
    if not (rows == rows[:1]).all():
        return "the mask differs between heads or batch rows"
    total, widths = keep.shape[-1], []
    for i, row in enumerate(rows[0]):
        pos = total - _NEW + i
        seen = np.flatnonzero(row)
        if seen.size == 0 or seen[-1] != pos or seen.size != seen[-1] - seen[0] + 1:
            return "the mask is not causal (a different pattern)"
        widths.append((seen.size, seen.size == pos + 1))  # (positions seen, all of them)
    short = {w for w, everything in widths if not everything}
    if not short:
        return None
    w = short.pop()
    if short or any(everything and w < n for n, everything in widths):
        return "the mask is not causal (windows of different widths)"
    return w


def mask_input(graph: ir.Graph) -> ir.Value:
    """The graph's `attention_mask` input, added (at position 1) when the source has none."""
    for v in graph.inputs:
        if v.name == IO.attention_mask:
            return v
    v = ir.Value(name=IO.attention_mask, shape=ir.Shape(["batch_size", "total_sequence_length"]),
                 type=ir.TensorType(ir.DataType.INT64))
    graph.inputs.insert(min(1, len(graph.inputs)), v)
    return v


def gqa_lengths(graph: ir.Graph, static: bool = False) -> tuple[ir.Value, ir.Value]:
    """(seqlens_k, total_sequence_length), reusing the subgraph when an earlier layer made it. `static`: for
    attentions over a static KV buffer, whose mask spans the buffer: the lengths from the mask's values."""
    names = (_STATIC + "/seqlens_k", _STATIC + "/total_sequence_length") if static else (_SEQLENS, _TOTAL)
    found = {o.name: o for n in graph for o in n.outputs if o.name in names}
    if len(found) == 2:
        return found[names[0]], found[names[1]]
    mask = mask_input(graph)
    if static:
        return lengths_from_values(graph, mask, _STATIC)
    b, i32 = Builder(graph, "attn_mask/"), ir.DataType.INT32
    one = b.const("one", np.array([1], np.int64))
    count = b.op("ReduceSum", [mask, one], name="attn_mask/ReduceSum", keepdims=0)
    less = b.op("Sub", [count, one], name="attn_mask/Sub")
    seqlens = b.op("Cast", [less], i32, ["batch_size"], name="attn_mask/CastSeqlens", output=_SEQLENS, to=i32)
    length = b.op("Shape", [mask], name="attn_mask/Shape", start=1, end=2)
    squeezed = b.op("Squeeze", [length], name="attn_mask/Squeeze")
    total = b.op("Cast", [squeezed], i32, [], name="attn_mask/CastTotal", output=_TOTAL, to=i32)
    graph.insert_before(graph.node(0), b.nodes) if len(graph) else b.place()
    return seqlens, total


def lengths_from_values(graph: ir.Graph, mask: ir.Value, prefix: str) -> tuple[ir.Value, ir.Value]:
    """(seqlens_k [B] int32, total_sequence_length [] int32) from the mask's values: its ones counted (Cast
    int32 -> ReduceSum), less one, and the largest count, as the genai builder's graph-capture form does. No
    Shape of the mask: right for a mask spanning a static buffer, and all on the GPU (the step form's)."""
    b, i32 = Builder(graph, f"{prefix}/"), ir.DataType.INT32
    axis, one = b.const("axis1", np.array([1], np.int64)), b.const("one_i32", np.array([1], np.int32))
    cast = b.op("Cast", [mask], i32, mask.shape, name=f"{prefix}/mask_i32", to=i32)
    count = b.op("ReduceSum", [cast, axis], i32, ["batch_size"], name=f"{prefix}/count", keepdims=0)
    seqlens = b.named("Sub", [count, one], f"{prefix}/seqlens_k", i32, ["batch_size"])
    total = b.named("ReduceMax", [count], f"{prefix}/total_sequence_length", i32, [], keepdims=0)
    graph.insert_before(graph.node(0), b.nodes)
    return seqlens.outputs[0], total.outputs[0]

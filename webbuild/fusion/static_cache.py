"""A static KV cache written in place by ScatterND (the WebNN execution provider's form), as GroupQueryAttention
over a shared past/present buffer takes it.

The form: each `past_key_values.*` is a buffer [B, kv, L, hd] of fixed length L; the new rows [B, kv, S, hd]
are written into it by ScatterND (under layout Transposes on either side), and the attention reads the whole
buffer, a mask spanning it (`attention_mask` [B, L], ones on the written slots) hiding the slots not yet
written. GroupQueryAttention computes the same when the buffer is its past (present: the same buffer, its
length kept): it writes the S new rows at seqlens_k - S + 1 onward, seqlens_k being the mask's ones less one.

`match` finds the write structurally; `check` proves by value that it puts the rows where GQA does: the
ScatterND indices are evaluated for probe inputs (fusion.probe) at the buffer's start, after a few positions
and at its end, and the write (Transposes, ScatterND, Transposes) replayed in numpy on numbered rows must give
the buffer with exactly those rows at mask length - S onward. attention_mask.static_causal checks the mask.
The probes are batch 1 (WebNN's form), their position_ids the positions the mask implies, as everywhere the
GQA rule probes: GQA counts positions from the mask.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from webbuild.fusion.rule import Miss
from webbuild.graph.ir import attr, const, prod
from webbuild.site.contract import IO

_PROBES = ((0, 3), (3, 2))  # (written, new) positions; the buffer's last slot is probed too
Perms = tuple[tuple[int, ...], ...]  # Transposes in the order they apply


@dataclass(frozen=True)
class Write:
    """The new K or V rows written into a static buffer."""
    past: ir.Value       # the buffer, a graph input [B, kv, L, hd]
    new: ir.Value        # the rows written, [B, kv, S, hd]
    indices: ir.Value    # ScatterND's
    to_data: Perms       # the Transposes from the buffer to ScatterND's data
    to_updates: Perms    # from the new rows to ScatterND's updates
    to_present: Perms    # from ScatterND's output to what the attention reads

    @property
    def buffer(self) -> int | None:
        """The buffer's declared length, None when symbolic."""
        dims = self.past.shape.dims if self.past.shape is not None else ()
        return dims[2] if len(dims) == 4 and isinstance(dims[2], int) else None


def match(present: ir.Value | None, rows: Callable[[ir.Value], bool]) -> Write | Miss | None:
    """The write behind `present` (K_all or V_all: what the attention reads, [B, kv, L, hd]); None when no
    scatter makes it. `rows(v)`: is v the new K/V heads (a RoPE output or the heads of a projection)?"""
    to_present, scattered = _transposes(present)
    n = prod(scattered)
    if n is None or n.op_type not in ("ScatterND", "ScatterElements"):
        return None
    if n.op_type == "ScatterElements" or attr(n, "reduction", "none") != "none":
        return Miss("a static KV cache written in place by ScatterElements or a reducing ScatterND "
                    "(GroupQueryAttention's shared buffer is built from a plain ScatterND)")
    data, indices, updates = n.inputs
    to_data, past = _transposes(data)
    if past is None or not past.is_graph_input() or not IO.present_of_past([past.name or ""]):
        return Miss("ScatterND writes into a KV buffer that is not a past_key_values input")
    if _order(to_data + to_present) != (0, 1, 2, 3):
        return Miss("the KV buffer ScatterND writes is read in another layout than its past input's")
    if indices is None or (indices.producer() is None and const(indices) is None):
        return Miss("ScatterND's positions are a graph input")
    for new, to_updates in _chain(updates):
        if rows(new):
            return Write(past, new, indices, to_data, to_updates, to_present)
    return Miss("the rows ScatterND writes into the KV buffer are not the new K/V heads")


def check(w: Write, kv: int, hd: int, buffer: int) -> str | None:
    """None when `w` writes the new rows exactly where GroupQueryAttention does in a `buffer`-long buffer, for
    the probe inputs (decoder_feeds's static form); else why not."""
    from webbuild.fusion import probe

    for past, n in (*_PROBES, (buffer - 1, 1)):
        c = const(w.indices)
        got = [c] if c is not None else probe.evaluate([w.indices], probe.decoder_feeds(past, n, buffer))
        if isinstance(got, str):
            return f"ScatterND's positions not checked ({got})"
        rows = np.arange(1, kv * n * hd + 1, dtype=np.float32).reshape(1, kv, n, hd)
        want = np.zeros((1, kv, buffer, hd), np.float32)
        written = _replay(w, want, np.asarray(got[0]), rows)
        want[:, :, past:past + n] = rows
        if isinstance(written, str):
            return written
        if written.shape != want.shape or not np.array_equal(written, want):
            return ("ScatterND writes the new K/V rows elsewhere than GroupQueryAttention does (the mask's "
                    "written length less the new positions, onward)")
    return None


def _replay(w: Write, buffer: np.ndarray, indices: np.ndarray, rows: np.ndarray) -> np.ndarray | str:
    """The write, in numpy."""
    data, updates = _apply(buffer, w.to_data), _apply(rows, w.to_updates)
    q = indices.shape[-1] if indices.ndim else 0
    if indices.ndim == 0 or q > data.ndim or updates.shape != indices.shape[:-1] + data.shape[q:]:
        return f"ScatterND's indices {indices.shape} do not fit its data {data.shape} and updates {updates.shape}"
    out = data.copy()
    flat = updates.reshape(-1, *data.shape[q:])
    for i, at in enumerate(indices.reshape(-1, q)):
        if not all(-d <= int(x) < d for x, d in zip(at, data.shape)):
            return "ScatterND writes outside the KV buffer"
        out[tuple(int(x) for x in at)] = flat[i]
    return _apply(out, w.to_present)


def _apply(x: np.ndarray, perms: Perms) -> np.ndarray:
    for p in perms:
        x = np.transpose(x, p)
    return x


def _order(perms: Perms) -> tuple[int, ...]:
    """Which input axis each output axis of the Transposes `perms` comes from ((0, 1, 2, 3): no change)."""
    order: tuple[int, ...] = (0, 1, 2, 3)
    for p in perms:
        order = tuple(order[i] for i in p)
    return order


def _transposes(v: ir.Value | None) -> tuple[Perms, ir.Value | None]:
    """(the Transposes making `v`, in the order they apply; what they start from)."""
    perms: list[tuple[int, ...]] = []
    while (t := prod(v, "Transpose")) is not None and len(perm := tuple(attr(t, "perm", ()))) == 4:
        perms.insert(0, perm)
        v = t.inputs[0]
    return tuple(perms), v


def _chain(v: ir.Value | None) -> list[tuple[ir.Value, Perms]]:
    """`v` and every value a run of Transposes made it from, nearest first, each with its Transposes to `v`."""
    out: list[tuple[ir.Value, Perms]] = []
    perms: Perms = ()
    while v is not None:
        out.append((v, perms))
        t = prod(v, "Transpose")
        perm = tuple(attr(t, "perm", ())) if t is not None else ()
        if t is None or len(perm) != 4:
            break
        perms, v = (perm, *perms), t.inputs[0]
    return out


def buffers(graph: ir.Graph) -> list[str]:
    """The past_key_values inputs a scatter writes into (under Transposes): a static KV cache, whatever the
    fusion made of it."""
    found = []
    for v in graph.inputs:
        if not IO.present_of_past([v.name or ""]):
            continue
        todo = [v]
        while todo:
            users = [u for x in todo for u in x.consumers()]
            if any(u.op_type in ("ScatterND", "ScatterElements") and u.inputs[0] in todo for u in users):
                found.append(v.name or "")
                break
            todo = [u.outputs[0] for u in users if u.op_type == "Transpose"]
    return found

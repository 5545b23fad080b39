"""Evaluate a small part of a graph on onnxruntime: the upstream closure of some values, fed with
probe inputs. Used to check rebuilt constants (RoPE caches) against what the source computes."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from webbuild.graph import cpu_session as cpu
from webbuild.site.contract import IO

_LIMIT = 400  # nodes; a closure bigger than this is not a cheap side computation


def closure(targets: list[ir.Value]) -> list[ir.Node] | None:
    """Nodes the targets depend on, in graph order; None when that is most of the graph."""
    seen: set[int] = set()
    todo = [p for t in targets if (p := t.producer()) is not None]
    while todo:
        n = todo.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if len(seen) > _LIMIT:
            return None
        todo.extend(p for v in n.inputs if v is not None and (p := v.producer()) is not None)
    graph = targets[0].graph
    assert graph is not None, "the targets are values of a graph"
    return [n for n in graph if id(n) in seen]


def evaluate(targets: list[ir.Value], feeds_for) -> list[np.ndarray] | str:
    """Run the closure of `targets`; `feeds_for(value)` gives an array per graph input (or None)."""
    nodes = closure(targets)
    if nodes is None:
        return "too much of the graph"
    mapping: dict[int, ir.Value] = {}
    inputs: list[ir.Value] = []
    inits: list[ir.Value] = []
    feeds: dict[str, np.ndarray | None] = {}

    def new(v: ir.Value) -> ir.Value:
        if id(v) not in mapping:
            if v.const_value is not None:
                c = ir.Value(name=f"c{len(mapping)}", const_value=ir.tensor(v.const_value.numpy()))
                inits.append(c)
            else:  # a graph input
                name = f"in{len(mapping)}"
                c = ir.Value(name=name, type=v.type)
                feeds[name] = feeds_for(v)
                inputs.append(c)
            mapping[id(v)] = c
        return mapping[id(v)]

    copies = []
    for n in nodes:
        ins = [None if v is None else mapping.get(id(v)) or new(v) for v in n.inputs]
        c = ir.Node(n.domain, n.op_type, ins, list(n.attributes.values()), num_outputs=len(n.outputs))
        for old, fresh in zip(n.outputs, c.outputs):
            fresh.name = f"v{len(mapping)}"
            mapping[id(old)] = fresh
        copies.append(c)
    if any(a is None for a in feeds.values()):
        return "needs an input it cannot probe: " + ", ".join(k for k, a in feeds.items() if a is None)
    outs = [mapping[id(t)] for t in targets]
    source = targets[0].graph
    assert source is not None, "closure read it"
    graph = ir.Graph(inputs, outs, nodes=copies, initializers=inits, opset_imports=dict(source.opset_imports))
    proto = ir.to_proto(ir.Model(graph, ir_version=10))
    sess = cpu.session(proto.SerializeToString())
    return sess.run(None, feeds)  # one feed per input, by its name


def decoder_feeds(past: int, n: int, buffer: int | None = None):
    """Probe inputs for a decoder at positions past .. past+n-1 (known interface names only). `buffer`: the
    static KV cache's form: every past input `buffer` positions long (zeros), the mask as long with ones on the
    past + n positions written."""

    def feeds_for(v: ir.Value):
        dims = [d if isinstance(d, int) else None for d in (v.shape or [])]
        name = v.name or ""
        half = v.type is not None and v.type.dtype == ir.DataType.FLOAT16  # an fp16 graph's float inputs
        floats = np.float16 if half else np.float32
        if name == "position_ids":
            return np.arange(past, past + n, dtype=np.int64)[None]
        if name == IO.attention_mask:
            return (np.arange(buffer) < past + n).astype(np.int64)[None] if buffer else np.ones((1, past + n), np.int64)
        if name in (IO.inputs_embeds, "input_embeds"):
            return np.zeros((1, n, dims[-1] or 1), floats)
        if name == IO.input_ids:
            return np.zeros((1, n), np.int64)
        if IO.present_of_past([name]):
            return np.zeros((1, dims[1] or 1, buffer or past, dims[3] or 1), floats)
        if name == IO.audio_features:
            return np.zeros((1, 1, dims[-1] or 1), floats)
        if name == IO.audio_offset:
            return np.zeros(1, np.int64)
        return None

    return feeds_for

"""Split layout (decoder_init + decoder_step) -> one decoder serving prefill and step; layout v2's
decoder_init (taking input_embeds already, webbuild.reference.source_v2) likewise.

After GQA fusion the prefill graph already does everything the step graph does: GQA takes a past
KV of any length (0 on the first call) and masks causally itself. So the init graph becomes the
one decoder by giving it the merged interface:
  inputs  inputs_embeds [B,S,H] (replacing the embedding lookup + audio splice, which move out of
          the graph for now), attention_mask [B,T], past_key_values.{i}.key|value [B,kv,P,hd]
  outputs logits, present.{i}.key|value (GQA's present outputs, instead of the stacked tensors),
each named as webbuild.site.contract.IO spells it.
The front (Gather on the tied weight + audio splice) can come back later as its own rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from webbuild.fusion.attention_mask import mask_input
from webbuild.fusion.rule import Miss, Rule
from webbuild.graph.ir import attr, axes_of, const_input, prod
from webbuild.site.contract import IO

# the split layout's own names (its export format, webbuild.zoo.export), which the merged graph replaces
# by the site's (webbuild.site.contract.IO)
SPLIT_INPUTS = {"input_ids", "audio_features", "audio_offset"}
SPLIT_LOGITS = "logits"
V2_INPUTS = {"input_embeds", "position_ids"}
STACKED = ("present_keys", "present_values")


def is_split_init(model: ir.Model) -> bool:
    """A prefill graph with stacked KV outputs: the split layout's, or layout v2's taking embeddings."""
    g = model.graph
    inputs = {v.name for v in g.inputs}
    return (inputs >= SPLIT_INPUTS or inputs == V2_INPUTS) and set(STACKED) <= {v.name for v in g.outputs}


@dataclass
class _Match:
    gqas: list[ir.Node]  # per layer, whose present outputs the stacked KV collects
    x0: ir.Value         # the residual stream entering layer 0, which inputs_embeds replaces
    hidden: int


def match(g: ir.Graph) -> _Match | Miss:
    layers = [_unstack(next(v for v in g.outputs if v.name == name)) for name in STACKED]
    for name, layer in zip(STACKED, layers):
        if layer is None:
            return Miss(f"{name} is not a stack of per-layer tensors", "present_keys")
    keys, values = layers
    assert keys is not None and values is not None  # the loop above returned otherwise
    found = [prod(k, "GroupQueryAttention") for k in keys]
    gqas = [n for n in found if n is not None]
    if len(gqas) != len(found) or any(prod(v) is not n for v, n in zip(values, gqas)):
        return Miss("stacked KV does not come from GroupQueryAttention outputs", "present_keys")
    start = _stream_start(g)
    if start is None:
        return Miss("first decoder norm not found", "inputs")
    left = _blocking_input(g, start[0])
    if left:
        return Miss("used by more than the embedding splice and shape reads", left)
    return _Match(gqas, *start)


def _rewrite(g: ir.Graph, m: _Match) -> None:
    embeds = ir.Value(name=IO.inputs_embeds, shape=ir.Shape(["batch_size", "sequence_length", m.hidden]),
                      type=m.gqas[0].outputs[0].type)
    ir.convenience.replace_all_uses_with(m.x0, embeds)
    for v in g.inputs:
        for user in [u for u in v.consumers() if _shape_read(u, v)]:
            user.replace_input_with(0, embeds)
    pasts, presents = _kv_io(m.gqas)
    logits = next(v for v in g.outputs if v.name == SPLIT_LOGITS)
    logits.name = IO.logits
    mask = mask_input(g)
    g.inputs.clear()
    g.inputs.extend([embeds, mask, *pasts])
    g.outputs.clear()
    g.outputs.extend([logits, *presents])


def _notes(hits: int) -> list[str]:
    return ["merge_split: decoder_init became the single decoder; decoder_step.onnx is not needed "
            "(same weights; GQA serves steps)"] if hits else []


def _shape_read(node: ir.Node, v: ir.Value) -> bool:
    """Shape of batch/sequence axes of an old [B, S, ...] input: the same as of inputs_embeds.
    (dynamo reads the sequence length from input_ids and the batch size from audio_features)."""
    if node.op_type != "Shape":
        return False
    start, end = attr(node, "start", 0), attr(node, "end", None)
    if v.name in ("input_ids", "position_ids"):
        return start in (0, 1) and end is not None and 0 < end <= 2
    return v.name == "audio_features" and start == 0 and end == 1


def _blocking_input(g: ir.Graph, x0: ir.Value) -> str | None:
    """An old input that reaches an output other than through x0 or a shape read, if any."""
    for v in g.inputs:
        if v.name in SPLIT_INPUTS | {"position_ids"} and any(
            _live(u, x0) for u in v.consumers() if not _shape_read(u, v)
        ):
            return v.name
    return None


def _live(node: ir.Node, stop: ir.Value) -> bool:
    """Whether `node` feeds a kept graph output without passing through `stop`."""
    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        for o in n.outputs:
            if o is stop:
                continue
            if o.is_graph_output() and o.name not in STACKED:
                return True
            todo.extend(o.consumers())
    return False


def _unstack(v: ir.Value) -> list[ir.Value | None] | None:
    """torch.stack spelled Concat(Unsqueeze(x_i, 0), ...) -> [x_i]."""
    cat = prod(v, "Concat")
    if cat is None or attr(cat, "axis") != 0:
        return None
    parts = [prod(x, "Unsqueeze") for x in cat.inputs]
    if any(u is None or axes_of(u) != [0] for u in parts):
        return None
    return [u.inputs[0] for u in parts if u is not None]


def _stream_start(g: ir.Graph) -> tuple[ir.Value, int] | None:
    """(residual stream entering layer 0, hidden size): the first norm whose input feeds a residual
    SkipSimplifiedLayerNormalization (Q/K norms never do)."""
    for n in g:
        if n.op_type == "SimplifiedLayerNormalization":
            x = n.inputs[0]
            if x is not None and any(u.op_type == "SkipSimplifiedLayerNormalization" for u in x.consumers()):
                return x, int(const_input(n, 1).shape[0])
    return None


def _kv_io(gqas: list[ir.Node]) -> tuple[list[ir.Value], list[ir.Value]]:
    pasts, presents = [], []
    for i, n in enumerate(gqas):
        kv, hd = int(attr(n, "kv_num_heads")), int(const_input(n, 7).shape[1]) * 2
        for slot, kind in ((3, "key"), (4, "value")):
            past = ir.Value(name=IO.past(i, kind), type=n.outputs[0].type,
                            shape=ir.Shape(["batch_size", kv, "past_sequence_length", hd]))
            n.replace_input_with(slot, past)
            present = n.outputs[slot - 2]
            present.name = IO.present(i, kind)
            present.shape = ir.Shape(["batch_size", kv, "total_sequence_length", hd])
            pasts.append(past)
            presents.append(present)
    return pasts, presents


RULE = Rule("merge_split", (), match, _rewrite, notes=_notes)

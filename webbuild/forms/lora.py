"""The adapted form of a built decoder: every projection of every layer gets a replaceable LoRA update.

The projections that read one input share one down matrix (webbuild.adapters.DOWN_GROUPS: q, k and v; gate and
up; o; down), and each of q, k, v, o, gate, up and down becomes

    y = Proj(x)                                  # the base projection, unchanged, [1, S, out]
    low = MatMul(Reshape(x, [-1, in]), lora.{i}.{group}.down)            # once per group, [S, r x members]
    out = Reshape(MatMul(low, lora.{i}.{proj}.up) + Reshape(y, [-1, out]), [1, -1, out])

(names: webbuild.site.contract.IO.lora) with `down` [in, R] and `up` [R, out] graph inputs without defaults, R
the group's rank (the adapter's rank times the group's members) and each up zero outside its projection's rows:
onnxruntime-web refuses a feed for an input that has an initializer, so an input with a default could never be set
in the browser. Fed empty ([in, 0] and [0, out]) or zeros, the graph computes the base model exactly. The base
graph is left as it is: the runtime decodes with it while no adapter is on, and with this form while one is.

Choices that shape the graph, each for onnxruntime-web's kernels (docs/adapters.md gives the measurements):
- shared downs: a one-row MatMul leaves most of the GPU idle, so a group's projections share one down;
- 2-D rows: x and y are flattened to [rows, width] (a view on WebGPU) so that onnxruntime's MatMulAddFusion makes
  the up MatMul and its Add one Gemm; the rows are one symbolic count, and the way back is a constant [1, -1, out]
  (no Shape node, which would run on the CPU EP, in the captured step);
- copies of the norms: onnxruntime-web fuses a norm with the Q/K/V MatMulNBits, or with gate/up and the SiLU,
  only where those are the norm's only readers, so each shared down reads a copy of the norm (_branch_norm);
- in the one-token step form, gate's and up's updates are their MatMulNBits' bias (mlp_updates_as_biases), which
  the fused MLP kernel takes; q, k and v are packed into one MatMulNBits with their 4-bit down beside it, taken
  into the fused norm + Q/K/V kernel through a spare reader (packed_updates, spare_readers); gate and up's 4-bit
  down rides in one such kernel with its copy of the norm; o's and down's downs join their projections' weights
  (joint_downs: one MatMulNBits gives both outputs, an 8-bit one adds the update); a down left over is an 8-bit
  MatMulNBits reading the down's codes and scales as inputs (quantized_downs).

The projections are found by the layer's structure, not by names (exporters name nodes differently):
GroupQueryAttention's query, key and value inputs lead back to q, k and v; o reads its output; the
residual norm after o feeds gate and up, gate's output goes through the SiLU's Sigmoid, and down reads
the product of both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx_ir as ir

from webbuild.adapters import DOWN_GROUPS, TARGET_MODULES, shared_rank
from webbuild.forms.form import Form, Made, Miss, NotApplicable
from webbuild.forms.lora_delta import delta_name
from webbuild.graph.builder import Builder, value
from webbuild.graph.files import rewrite_file
from webbuild.graph.ir import dead_code_elimination
from webbuild.site.adapter_pack import BLOCK as INT8_BLOCK
from webbuild.site.adapter_pack import down_bits
from webbuild.site.contract import (
    DELTA_BITS,
    DELTA_CODES,
    DELTA_GROUPS,
    DELTA_SCALES,
    DOWN_CODES,
    DOWN_SCALES,
    FUSED_DOWNS,
    IO,
    JOINT_CODES,
    JOINT_DOWNS,
    JOINT_SCALES,
    PACKED_UPS,
    UP_CODES,
    UP_SCALES,
)

PREFIX = "lora/"  # the adapted graph's nodes and constants are named under it
RANK_DIM = "lora_rank"
LAYOUT = "lora_layout"  # a graph input's `meta` key: its layout record (step_layout), set by the pass that makes it
ROW_ALIGN = 32  # a joint's parts start on whole blocks of the up's K (joint_downs)
SPARE_WIDTH = 16  # outputs of the spare readers beside a down alone on its norm (spare_readers)
ROWS_DIM = "lora_rows"  # batch x sequence: declared on both sides of the up MatMul's Add, see the docstring
QKV = ("q_proj", "k_proj", "v_proj")
NORMS = ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")
_THROUGH = ("Reshape", "Transpose", "Cast", "SimplifiedLayerNormalization", "LayerNormalization", "Squeeze",
            "Unsqueeze")  # what may sit between a projection and GroupQueryAttention (q/k norms, head split)


class NoProjections(NotApplicable):
    """The decoder's layers do not show the seven projections an adapter needs."""


def write_adapted(folder: Path, name: str) -> Made:
    """Write the adapted form of the decoder `folder/name` beside it as `<stem>.lora.onnx` (same weights file).
    Raises NoProjections for a decoder whose projections cannot be found (the driver's Miss)."""
    dest = folder / f"{Path(name).stem}.lora.onnx"
    rewrite_file(folder / name, dest, lora_form)
    return Made(dest.name)


ADAPTED = Form("adapted", "a quantized decoder with GroupQueryAttention, in a build with adapters: every "
               "projection given a LoRA update from graph inputs", write_adapted)


def lora_form(model: ir.Model) -> bool:
    """Rewrite `model` in place; True when it changed (always, or NoProjections)."""
    for layer, projections in enumerate(find_projections(model.graph)):
        for group, projs in DOWN_GROUPS.items():
            nodes = [projections[p] for p in projs]
            _shares_input(nodes, layer, group)
            source = _branch_norm(model.graph, nodes[0], f"lora/{layer}/{group}/norm") if len(nodes) > 1 else None
            _adapt(model.graph, nodes, layer, group, source)
    return True


def _shares_input(nodes: list[ir.Node], layer: int, group: str) -> None:
    if len({id(n.inputs[0]) for n in nodes}) > 1:
        raise NoProjections(f"layer {layer}: {', '.join(n.name or n.op_type for n in nodes)} do not read one input, "
                            f"so they cannot share {group}'s down matrix (webbuild.adapters.DOWN_GROUPS)")


def _branch_norm(graph: ir.Graph, first: ir.Node, name: str) -> ir.Value | None:
    """The normalised input of a group's projections computed once more for its branches, where the layer's own
    norm feeds the projections alone: onnxruntime-web fuses such a norm with them into one kernel, norm + Q/K/V
    (MatMulNBitsQkvFusion: the norm's output 0 read by exactly three MatMulNBits) and norm + gate/up + SiLU x up
    (MatMulNBitsMlpFusion: output 0 read by exactly two, and output 3, the residual sum, by one reader at most),
    which a further reader stops. So a SkipSimplifiedLayerNormalization's copy reads what neither fusion
    counts: before q, k and v, a plain norm of the residual sum (output 3 of the norm before the attention, added
    where absent); before gate and up, the same op on the input and skip swapped (equal sums). A
    SimplifiedLayerNormalization's copy reads the same input and scale with its axis -1 written as a number.
    Both differ from the original as onnxruntime's common subexpression elimination (equal op, inputs and
    attributes) sees it, so it does not merge them back. None where there is nothing to keep."""
    x = first.inputs[0]
    norm = x.producer() if x is not None else None
    if norm is None or norm.op_type not in NORMS or norm.outputs[0] is not x:
        return None
    if any(not (is_projection(user) and user.op_type == "MatMulNBits") for user, _ in x.uses()):
        return None
    skip, shape, qkv = norm.op_type == NORMS[1], x.shape, len(x.uses()) == 3
    if not skip and (shape is None or norm.attributes.get_int("axis", -1) != -1):
        return None
    if not skip:
        op, inputs = norm.op_type, list(norm.inputs)
    elif qkv:
        op, inputs = NORMS[0], [_residual_sum(norm, name), norm.inputs[2]]
    else:
        op, inputs = NORMS[1], [norm.inputs[1], norm.inputs[0], *norm.inputs[2:]]
    copy = Builder(graph, PREFIX).named(op, inputs, name, x.type.dtype if x.type else ir.DataType.FLOAT, shape,
                                        domain=norm.domain if op == norm.op_type else "")
    for key in ("epsilon", "axis", "stash_type"):
        if key in norm.attributes:
            copy.attributes[key] = norm.attributes[key]
    if not skip and shape is not None:  # the same op on the same inputs: the last axis by its number, which
        copy.attributes["axis"] = ir.AttrInt64("axis", len(shape) - 1)  # CSE tells apart from -1
    graph.insert_after(norm, [copy])
    return copy.outputs[0]


def _residual_sum(norm: ir.Node, name: str) -> ir.Value:
    """A SkipSimplifiedLayerNormalization's input + skip (its output 3), made an output where it is not."""
    if len(norm.outputs) < 4:
        norm.resize_outputs(4)  # the new ones unnamed: outputs 1 and 2 stay absent
    added = norm.outputs[3]
    if not added.name:
        added.name = f"{name}/sum"
    return added


def is_projection(node: ir.Node | None) -> bool:
    """A MatMulNBits, or a MatMul with constant weights (a build without quantization)."""
    if node is None or node.op_type not in ("MatMulNBits", "MatMul"):
        return False
    weights = node.inputs[1]
    return node.op_type == "MatMulNBits" or (weights is not None and weights.const_value is not None)


def find_projections(graph: ir.Graph) -> list[dict[str, ir.Node]]:
    """{projection: node} of each decoder layer, in layer order."""
    layers = [_layer(n, i) for i, n in enumerate(n for n in graph if n.op_type == "GroupQueryAttention")]
    if not layers:
        raise NoProjections("the decoder has no GroupQueryAttention, so its layers cannot be told apart")
    return layers


def _layer(gqa: ir.Node, index: int) -> dict[str, ir.Node]:
    found = {proj: _back_to_projection(gqa.inputs[i]) for i, proj in enumerate(("q_proj", "k_proj", "v_proj"))}
    found["o_proj"] = _forward_to_projection(gqa.outputs[0])
    norm = _forward(found["o_proj"], "SkipSimplifiedLayerNormalization") if found["o_proj"] else None
    mlp = [u for u, _ in norm.outputs[0].uses() if is_projection(u)] if norm else []
    found["gate_proj"] = next((p for p in mlp if any(u.op_type == "Sigmoid" for u, _ in p.outputs[0].uses())), None)
    found["up_proj"] = next((p for p in mlp if p is not found["gate_proj"]), None)
    found["down_proj"] = _down(found["up_proj"])
    missing = [p for p in TARGET_MODULES if found.get(p) is None]
    if missing or len(mlp) != 2:
        raise NoProjections(f"layer {index}: could not find {', '.join(missing) or 'gate_proj and up_proj apart'} "
                            "(an adapter needs the seven projections as separate MatMulNBits or MatMul nodes)")
    return {p: node for p in TARGET_MODULES if (node := found[p]) is not None}  # all of them, as checked


def _back_to_projection(v: ir.Value | None) -> ir.Node | None:
    node = v.producer() if v is not None else None
    while node is not None and node.op_type in _THROUGH:
        node = node.inputs[0].producer() if node.inputs[0] is not None else None
    return node if is_projection(node) else None


def _forward_to_projection(v: ir.Value) -> ir.Node | None:
    for user, _ in v.uses():
        if is_projection(user):
            return user
        if user.op_type in _THROUGH:
            return _forward_to_projection(user.outputs[0])
    return None


def _forward(node: ir.Node, op: str) -> ir.Node | None:
    return next((u for u, _ in node.outputs[0].uses() if u.op_type == op), None)


def _down(up: ir.Node | None) -> ir.Node | None:
    """The projection reading SiLU(gate) * up."""
    product = _forward(up, "Mul") if up is not None else None
    return next((u for u, _ in product.outputs[0].uses() if is_projection(u)), None) if product else None


def _adapt(graph: ir.Graph, nodes: list[ir.Node], layer: int, group: str, source: ir.Value | None = None) -> None:
    """Each node's output y -> y + (x @ down) @ up on 2-D rows, x their one input (or `source` where given, a value
    equal to it: _branch_norm), `down` the group's graph input and `up` each projection's."""
    x = source or nodes[0].inputs[0]
    assert x is not None, "a projection reads its input"
    dtype = x.type.dtype if x.type is not None else ir.DataType.FLOAT
    n_in = _dims(nodes[0])[0]
    rank = RANK_DIM if len(nodes) == 1 else f"{RANK_DIM}_{group}"
    b = Builder(graph, PREFIX)
    down = b.input(IO.lora_input(layer, group, "down"), dtype, [n_in, rank])
    prefix = f"lora/{layer}/{group}"
    rows = b.reshape(x, [-1, n_in], f"{prefix}/x2", dtype, [ROWS_DIM, n_in])
    low = b.named("MatMul", [rows.outputs[0], down], f"{prefix}/low", dtype, [ROWS_DIM, rank])
    order = {id(n): i for i, n in enumerate(graph)}
    graph.insert_before(min(nodes, key=lambda n: order[id(n)]), [rows, low])  # x is there, no update is yet
    for node, proj in zip(nodes, DOWN_GROUPS[group]):
        _add_update(graph, node, f"lora/{layer}/{proj}", low.outputs[0],
                    b.input(IO.lora_input(layer, proj, "up"), dtype, [rank, _dims(node)[1]]))


def _add_update(graph: ir.Graph, node: ir.Node, prefix: str, low: ir.Value, up: ir.Value) -> None:
    """node's output y -> y + low @ up, on 2-D rows, for every reader of y."""
    y = node.outputs[0]
    dtype = y.type.dtype if y.type is not None else ir.DataType.FLOAT
    n_out = _dims(node)[1]
    users = list(y.uses())
    b = Builder(graph, PREFIX)
    base = b.reshape(y, [-1, n_out], f"{prefix}/y2", dtype, [ROWS_DIM, n_out])
    delta = b.named("MatMul", [low, up], f"{prefix}/delta", dtype, [ROWS_DIM, n_out])
    add = b.named("Add", [delta.outputs[0], base.outputs[0]], f"{prefix}/out2", dtype, [ROWS_DIM, n_out])
    back = b.reshape(add.outputs[0], _back_shape(y, n_out), f"{prefix}/out", dtype, y.shape)
    for user, index in users:
        user.replace_input_with(index, back.outputs[0])
    for i, graph_out in enumerate(graph.outputs):
        if graph_out is y:
            graph.outputs[i] = back.outputs[0]
    graph.insert_after(node, [base, delta, add, back])


@dataclass(frozen=True)
class StepPass:
    """One pass of the adapted step form: `run` rewrites the graph and says how many places it took, `expects`
    counts the places the layout (webbuild.site.contract's groups) has for it beforehand, `left` says what a place
    not taken stays as. The nodes and inputs that passes `leaves_unread` go before a pass that `reads_tidy`."""
    name: str
    expects: Callable[[ir.Graph], int]
    run: Callable[[ir.Model], int]
    left: str
    leaves_unread: bool = False
    reads_tidy: bool = False


def _branches(graph: ir.Graph, part: str, owners: tuple[str, ...]) -> int:
    """How many of the graph's branch nodes (`lora/{i}/{owner}/{part}`) are `part` of one of `owners`."""
    return sum(_branch_part(n.name, owners) == part for n in graph)


def adapted_step(model: ir.Model) -> list[Miss]:
    """The adapted passes in the step form's order (STEP_PASSES: quantized_downs last, after the nodes and inputs
    the others left unread go); a pass that takes fewer places than its layout expects is a Miss that says how many
    and what they stay as, losing where it takes none (the step form ships without that part of its layout), as
    the int8 twin's MatMulNBits left are (webbuild.forms.wasm_twin). A base decoder has no branch: nothing is
    expected of any pass."""
    misses, unread = [], False
    for step in STEP_PASSES:
        if step.reads_tidy and unread:
            dead_code_elimination(model)
            drop_unread_inputs(model.graph)
        expected = step.expects(model.graph)
        took = step.run(model)
        unread |= step.leaves_unread and took > 0
        if took < expected:
            misses.append(Miss(f"{step.name} took {took} of {expected}: {step.left}", loses=took == 0))
    return misses


def quantized_downs(graph: ir.Graph) -> int:
    """In a one-token step graph, each down MatMul x [1, in] @ down [in, R] as a MatMulNBits reading the down as
    graph inputs in its own layout, in adapter_pack.down_bits: `lora.{i}.{group}.down_codes` uint8 [R, blocks,
    32 * bits / 8] (zero point 128, or 8 for 4 bits) and `lora.{i}.{group}.down_scales` [R, blocks]
    (webbuild.site.adapter_pack.quantize_blocks), R static (the build's rank times the group's members). A
    FUSED_DOWNS group's 4-bit down reads its norm itself, not the norm's 2-D rows, so that spare_readers can make
    the two one kernel (also where packed_updates left q, k and v unpacked). A float MatMul of one row gives
    each workgroup a tile of R outputs and loops it over all 1024-3072 inputs; MatMulNBits' decode kernel spreads
    the inputs over a workgroup, in one dispatch. Returns how many downs changed."""
    return sum(_as_quantized(graph, n) for n in list(graph)
               if n.op_type == "MatMul" and _branch_part(n.name, tuple(DOWN_GROUPS)) == "low")


def _branch_part(name: str | None, owners: tuple[str, ...]) -> str | None:
    """What node `lora/{layer}/{owner}/{part}` of a branch (as _adapt and _add_update name them) is, for an
    owner (a group or a projection) among `owners`; None for any other node."""
    parts = (name or "").split("/")
    return parts[3] if len(parts) == 4 and parts[0] == "lora" and parts[2] in owners else None


def _as_quantized(graph: ir.Graph, low: ir.Node) -> bool:
    x, down = low.inputs
    if x is None or down is None or down.shape is None or not isinstance(down.shape[0], int) \
            or down not in graph.inputs:
        return False
    _, layer, group, _ = (low.name or "").split("/")
    rank, name = shared_rank(group), f"{low.name}{down_bits(group)}"
    rows = x.producer()
    if group in FUSED_DOWNS and rows is not None and rows.op_type == "Reshape" and rows.inputs[0] is not None:
        # the norm's own output, not its 2-D rows (a Reshape): the fused kernel takes the norm's direct readers
        norm = rows.inputs[0]
        dims = [*norm.shape[:-1], rank] if norm.shape is not None else None
        node = _quantized_down(graph, norm, int(layer), group, down.shape[0], name, dims, 0)
        new = [node, Builder(graph, PREFIX).reshape(node.outputs[0], [-1, rank], f"{name}/rows", _dtype(x),
                                                    [ROWS_DIM, rank])]
    else:  # accuracy level 0: one dispatch (level 4's DP4A path is two)
        new = [_quantized_down(graph, x, int(layer), group, down.shape[0], name, [ROWS_DIM, rank], 0)]
    graph.insert_before(low, new)
    ir.convenience.replace_all_uses_with(low.outputs[0], new[-1].outputs[0])
    graph.remove(low, safe=True)
    graph.inputs.remove(down)
    return True


def packed_updates(graph: ir.Graph) -> int:
    """In a one-token step graph, the projections of each PACKED_UPS group (q, k and v) become one MatMulNBits whose
    weights are theirs concatenated (Concat nodes of initializers, which onnxruntime folds when it makes the session:
    no bigger download), and the group's down a 4-bit MatMulNBits of `lora.{i}.{group}.down_codes` and
    `.down_scales` (webbuild.site.adapter_pack.quantize_blocks), both reading the layer's norm. The members' updates
    are then added at once, low @ `lora.{i}.{group}.up` (their ups side by side) + the packed output on 2-D rows
    (one Gemm once optimized), and a Split gives each reader its part. With spare_readers' third reader the norm
    and both MatMulNBits are one fused kernel (MatMulNBitsQkvFusion: 4-bit projections that take no bias, the
    norm's only readers, two of them of equal width): three dispatches a layer where the 8-bit down, the norm, the
    packed projection with its updates as bias, the up and the Split were five (BENCHMARKS.md). GroupQueryAttention's
    packed input would save the Split, but onnxruntime-web 1.30 refuses it with Q/K norms inside (Qwen3's). The
    nodes and inputs left unread go with dead_code_elimination and drop_unread_inputs. Returns how many groups
    were packed."""
    nodes = {n.name or "": n for n in graph}
    return sum(_pack(graph, nodes, low, group) for name, low in list(nodes.items()) for group in PACKED_UPS
               if _branch_part(name, (group,)) == "low")


def _pack(graph: ir.Graph, nodes: dict[str, ir.Node], low: ir.Node, group: str) -> bool:
    prefix = (low.name or "").removesuffix("/low")  # lora/{layer}/{group}, as _adapt names it
    layer = int(prefix.split("/")[1])
    adds = [nodes.get(f"lora/{layer}/{proj}/out2") for proj in DOWN_GROUPS[group]]
    projs = _packable([_updated_projection(add) for add in adds])
    backs = [next(iter(add.outputs[0].uses()))[0] for add in adds if add is not None]
    x = projs[0].inputs[0] if projs else None
    if projs is None or x is None or len(backs) != len(projs) or low.outputs[0].shape is None:
        return False
    first, widths, dtype = projs[0], [_dims(p)[1] for p in projs], _dtype(low.outputs[0])
    (n_in, _), n_out, rank = _dims(first), sum(widths), shared_rank(group)
    b = Builder(graph, PREFIX)
    weights, scales = (b.named("Concat", [p.inputs[i] for p in projs], f"{prefix}/{part}", _dtype(first.inputs[i]),
                               None, axis=0) for i, part in ((1, "weights"), (2, "scales")))
    packed = _nbits(graph, [x, weights.outputs[0], scales.outputs[0]], f"{prefix}/packed", first, n_out, dtype)
    # the fused kernel's condition: the accuracy level of the projections beside it (and 4 bits, blocks of 32)
    down = _quantized_down(graph, x, layer, group, n_in, f"{prefix}/low4", None,
                           first.attributes.get_int("accuracy_level", 0))
    low2 = b.reshape(down.outputs[0], [-1, rank], f"{prefix}/low2", dtype, [ROWS_DIM, rank])
    y2 = b.reshape(packed.outputs[0], [-1, n_out], f"{prefix}/y2", dtype, [ROWS_DIM, n_out])
    up = _layout_input(graph, IO.lora_input(layer, group, "up"), dtype, [low.outputs[0].shape[1], n_out],  # as before
                {"kind": "packed_up", "part": "values", "dims": [rank, n_out],
                 "from": [IO.lora_input(layer, proj, "up") for proj in DOWN_GROUPS[group]]})
    delta = b.named("MatMul", [low2.outputs[0], up], f"{prefix}/delta", dtype, [ROWS_DIM, n_out])
    add = b.named("Add", [delta.outputs[0], y2.outputs[0]], f"{prefix}/out2", dtype, [ROWS_DIM, n_out])
    parts = [value(f"{prefix}/{proj}2", dtype, [ROWS_DIM, w]) for proj, w in zip(DOWN_GROUPS[group], widths)]
    sizes = b.const(f"split_{'_'.join(map(str, widths))}", np.array(widths, np.int64))
    split = b.node("Split", [add.outputs[0], sizes], f"{prefix}/split", parts, axis=-1)
    new = [weights, scales, packed, down, low2, y2, delta, add, split]
    for proj, back, part, w in zip(DOWN_GROUPS[group], backs, parts, widths):
        out = back.outputs[0]
        new.append(b.reshape(part, _back_shape(out, w), f"{prefix}/{proj}", dtype, out.shape))
        ir.convenience.replace_all_uses_with(out, new[-1].outputs[0])
    graph.insert_before(first, new)
    return True


def joint_downs(model: ir.Model) -> int:
    """In a one-token step graph, each JOINT_DOWNS group's projection, down and update become two MatMulNBits:

        joint = MatMulNBits(x, lora.{i}.{group}.joint_codes, .joint_scales)    # [.., rows + rank]: y, then x @ down
        out = MatMulNBits(joint, lora.{i}.{proj}.up_codes, .up_scales)          # 8-bit [rows + rank, out]: [I; up]

    The joint weights are the projection's own (bits, blocks, accuracy level) with the down's rows after them (rows:
    the projection's width rounded up to ROW_ALIGN, rank: the group's rounded up too, zero rows between), and the up's
    8-bit weights are an identity over the first `rows` (code 192 at scale 1/64: exactly 1) and the up below it, so
    `out` is y + x @ down @ up; at accuracy level 0 the identity passes y on unquantized. One kernel where the
    projection, the down and the update's Gemm were three: a dispatch of M = 1 costs its launch whatever its size.
    The base rows are graph inputs too, since onnxruntime folds a Concat of initializers only: the page copies them
    from the decoder's weights file once, at load, by their layout records' `base` (the weights file's `location`,
    `offset` and `length`: step_layout). Only a projection whose weights are external data is joined (the page has
    no other bytes of it). Returns how many groups were joined."""
    graph = model.graph
    nodes = {n.name or "": n for n in graph}
    lows = [(low, g) for name, low in list(nodes.items()) for g in JOINT_DOWNS if _branch_part(name, (g,)) == "low"]
    return sum(_join(graph, nodes, low, group) for low, group in lows)


def _join(graph: ir.Graph, nodes: dict[str, ir.Node], low: ir.Node, group: str) -> bool:
    """One group's joint form (joint_downs); False, the branch left as it is (quantized_downs takes its down),
    where the projection is not a plain MatMulNBits of external weights."""
    layer, (proj_name,) = int((low.name or "").split("/")[1]), DOWN_GROUPS[group]
    add = nodes.get(f"lora/{layer}/{proj_name}/out2")
    proj = _updated_projection(add)
    back = [u for u, _ in add.outputs[0].uses()] if add is not None else []
    if proj is None or proj.op_type != "MatMulNBits" or len(proj.inputs) != 3 or len(back) != 1:
        return False
    x, codes, scales = proj.inputs
    code_base, scale_base = (_external(v) for v in (codes, scales))
    if x is None or code_base is None or scale_base is None:
        return False
    (n_in, n_out), dtype = _dims(proj), _dtype(x)
    bits, block = proj.attributes.get_int("bits", 4), proj.attributes.get_int("block_size", 32)
    rows, rank, blocks = _aligned(n_out), _aligned(shared_rank(group)), -(-n_in // block)
    prefix, total = f"lora/{layer}/{group}", rows + rank
    down = {"kind": "joint_down", "bits": bits, "block": block, "rows": rows,
            "from": [IO.lora_input(layer, group, "down")]}
    joint_codes = _layout_input(graph, IO.lora_input(layer, group, JOINT_CODES), ir.DataType.UINT8,
                         [total, blocks, block * bits // 8], down | {"part": "codes", "base": code_base})
    joint_scales = _layout_input(graph, IO.lora_input(layer, group, JOINT_SCALES), dtype, [total, blocks],
                          down | {"part": "scales", "base": scale_base})
    joint = _nbits(graph, [x, joint_codes, joint_scales], f"{prefix}/joint", proj, total, dtype)
    out = back[0].outputs[0]
    up = _nbits_of_inputs(graph, joint.outputs[0], _factor_inputs(layer, proj_name, UP_CODES, UP_SCALES), total, n_out,
                          8, f"lora/{layer}/{proj_name}/up8", list(out.shape) if out.shape is not None else None,
                          domain=proj.domain,
                          record={"kind": "joint_up", "rows": rows, "from": [IO.lora_input(layer, proj_name, "up")]})
    graph.insert_before(proj, [joint, up])
    ir.convenience.replace_all_uses_with(out, up.outputs[0])
    return True


def _aligned(n: int) -> int:
    """n rounded up to whole ROW_ALIGN rows: each joint part starts on a block of the up's K."""
    return -(-n // ROW_ALIGN) * ROW_ALIGN


def _external(v: ir.Value | None) -> dict | None:
    """{location, offset, length} of an initializer stored as external data; None for any other value."""
    t = v.const_value if v is not None else None
    if not isinstance(t, ir.ExternalTensor) or t.length is None:
        return None
    return {"location": str(t.location), "offset": int(t.offset or 0), "length": int(t.length)}


def _nbits(graph: ir.Graph, inputs: list, name: str, like: ir.Node, n_out: int, dtype: ir.DataType) -> ir.Node:
    """A MatMulNBits of `n_out` outputs quantized as `like` is."""
    node = Builder(graph, PREFIX).named("MatMulNBits", inputs, name, dtype, None, domain=like.domain)
    node.attributes.update(like.attributes)
    node.attributes["N"] = ir.AttrInt64("N", n_out)
    return node


def _quantized_down(graph: ir.Graph, x: ir.Value, layer: int, group: str, n_in: int, name: str, dims: list | None,
                    accuracy_level: int) -> ir.Node:
    """x @ the group's down as a MatMulNBits (bits: adapter_pack.down_bits, blocks of 32) of new graph inputs,
    `lora.{i}.{group}.down_codes` uint8 [R, blocks, 32 * bits / 8] and `.down_scales` [R, blocks] in x's type, R
    the group's rank as a number."""
    return _nbits_of_inputs(graph, x, _factor_inputs(layer, group, DOWN_CODES, DOWN_SCALES), n_in, shared_rank(group),
                            down_bits(group), name, dims, accuracy_level,
                            record={"kind": "down", "from": [IO.lora_input(layer, group, "down")]})


def _factor_inputs(layer: int, owner: str, codes: str, scales: str) -> tuple[str, str]:
    """The names of a layer's codes and scales inputs of a group or projection."""
    return IO.lora_input(layer, owner, codes), IO.lora_input(layer, owner, scales)


def _nbits_of_inputs(graph: ir.Graph, x: ir.Value, names: tuple[str, str], n_in: int, n_out: int, bits: int,
                     name: str, dims: list | None, accuracy_level: int = 0, domain: str = "com.microsoft",
                     record: dict | None = None) -> ir.Node:
    """x @ W as a MatMulNBits in blocks of 32 whose W are new graph inputs `names`: codes uint8 [n_out, blocks,
    32 * bits / 8] and scales [n_out, blocks] in x's type, each with its layout record (`record`, a codes and a
    scales part of it: step_layout). Accuracy level 0 by default: one dispatch (level 4's DP4A path is two)."""
    blocks, dtype = -(-n_in // INT8_BLOCK), _dtype(x)
    kind = (record or {}) | {"bits": bits, "block": INT8_BLOCK}
    codes = _layout_input(graph, names[0], ir.DataType.UINT8, [n_out, blocks, INT8_BLOCK * bits // 8],
                          kind | {"part": "codes"} | _delta_part(kind, names[0]))
    scales = _layout_input(graph, names[1], dtype, [n_out, blocks],
                           kind | {"part": "scales"} | _delta_part(kind, names[1]))
    return Builder(graph, PREFIX).named("MatMulNBits", [x, codes, scales], name, dtype, dims, domain=domain, K=n_in,
                                        N=n_out, bits=bits, block_size=INT8_BLOCK, accuracy_level=accuracy_level)


def spare_readers(model: ir.Model) -> int:
    """After the last dead-code elimination (it would drop them again): spare readers of the norm that a branch's
    4-bit MatMulNBits reads (a FUSED_DOWNS group's down, a DELTA_GROUPS member's merged update), MatMulNBits of zero
    scales whose outputs nothing reads, so that the norm has the readers onnxruntime-web fuses with it into one
    kernel (MatMulNBitsQkvFusion, made for Q, K and V): exactly three 4-bit MatMulNBits of one quantization without
    bias, two of one width and the third of another. Beside q, k and v's packed projection (packed_updates) one
    spare of the down (its codes) makes the three; beside gate's and up's merged updates (merged_deltas, one width)
    one narrow spare of zero codes; where the down is the norm's only reader (gate and up's copy of the norm without
    merged updates: _branch_norm), two. Their cost is their outputs in the fused kernel. Returns how many spares
    were added."""
    graph, added, seen = model.graph, 0, set()
    owners = FUSED_DOWNS + tuple(p for g in DELTA_GROUPS for p in DOWN_GROUPS[g])
    for node in [n for n in graph if _branch_part(n.name, owners) in ("low4", "delta4")]:
        x = node.inputs[0]
        norm = x.producer() if x is not None else None
        readers = [u for u, _ in x.uses()] if x is not None else []
        if id(x) in seen or norm is None or norm.op_type not in NORMS or len(readers) > 2 \
                or not all(_fuses_with(node, u) for u in readers):
            continue
        seen.add(id(x))
        spares = _spares(graph, node, [_dims(u)[1] for u in readers])
        graph.insert_after(node, spares)
        added += len(spares)
    return added


def _spares(graph: ir.Graph, node: ir.Node, widths: list[int]) -> list[ir.Node]:
    """The spare readers that make a norm's readers of `widths` (one or two, `node` among them) the three of
    spare_readers."""
    if len(widths) == 2 and widths[0] != widths[1]:
        return [_spare(graph, node, "spare", node.inputs[1])]
    narrow = SPARE_WIDTH if widths[0] != SPARE_WIDTH else 2 * SPARE_WIDTH
    return [_spare(graph, node, name, None, narrow) for name in ("spare", "spare2")[:3 - len(widths)]]


def _fuses_with(down: ir.Node, other: ir.Node) -> bool:
    """Whether MatMulNBitsQkvFusion would take `other` beside `down`: a MatMulNBits of the same input size,
    bits, blocks and accuracy level, without zero points, groups or bias."""
    keys = ("K", "bits", "block_size", "accuracy_level")
    return other.op_type == "MatMulNBits" and len(other.inputs) == 3 \
        and all(other.attributes.get_int(k, 0) == down.attributes.get_int(k, 0) for k in keys)


def _spare(graph: ir.Graph, down: ir.Node, name: str, codes: ir.Value | None, width: int | None = None) -> ir.Node:
    """A MatMulNBits quantized as `down`, reading its input, of `width` outputs (default the down's) with zero
    scales and `codes` (default zero codes): shared initializers, one per shape."""
    (n_in, n_out), dtype = _dims(down), _dtype(down.inputs[2])
    blocks, width = -(-n_in // INT8_BLOCK), width or n_out
    # each spare its own initializers: onnxruntime's common subexpression elimination would merge equal spares
    tag = "" if name == "spare" else f"_{name}"
    b = Builder(graph, PREFIX)
    if codes is None:
        code_dims = (width, blocks, INT8_BLOCK * down.attributes.get_int("bits", 4) // 8)
        codes = b.const(f"zero_codes_{'_'.join(map(str, code_dims))}{tag}", np.zeros(code_dims, np.uint8))
    zeros = b.const(f"zero_scales_{width}_{blocks}{tag}", np.zeros((width, blocks), dtype.numpy()))
    spare = b.named("MatMulNBits", [down.inputs[0], codes, zeros], f"{down.name}/{name}", dtype, None,
                    domain=down.domain)
    spare.attributes.update(down.attributes)
    spare.attributes["N"] = ir.AttrInt64("N", width)
    return spare


def _dtype(v: ir.Value | None) -> ir.DataType:
    return v.type.dtype if v is not None and v.type is not None else ir.DataType.FLOAT


def _updated_projection(add: ir.Node | None) -> ir.Node | None:
    """The projection whose output `lora/{i}/{proj}/out2` adds an update to (through its 2-D Reshape)."""
    y2 = add.inputs[1].producer() if add is not None and add.inputs[1] is not None else None
    return y2.inputs[0].producer() if y2 is not None and y2.inputs[0] is not None else None


def _packable(projs: list[ir.Node | None]) -> list[ir.Node] | None:
    """`projs` where they are MatMulNBits reading one input with initializer weights and scales, no zero points,
    groups or bias, and the same quantization (each output row has its own blocks, so their weights concatenate
    row-wise); None otherwise."""
    same = ("K", "bits", "block_size", "accuracy_level")
    found = [p for p in projs if p is not None and p.op_type == "MatMulNBits" and len(p.inputs) == 3]
    if len(found) != len(projs) or not found:
        return None
    first = found[0]
    if all(p.inputs[0] is first.inputs[0] and all(v is not None and v.const_value is not None for v in p.inputs[1:])
           and all(p.attributes.get_int(k, -1) == first.attributes.get_int(k, -1) for k in same) for p in found):
        return found
    return None


def drop_unread_inputs(graph: ir.Graph) -> None:
    """The lora inputs no node reads any more (a packed group's members' ups)."""
    for v in [v for v in graph.inputs if IO.lora_parts(v.name or "") and not v.uses()]:
        graph.inputs.remove(v)


def mlp_updates_as_biases(graph: ir.Graph) -> int:
    """In a one-token step graph (webbuild.forms.step), gate's and up's updates become their MatMulNBits'
    bias input: delta [1, out] is a bias [out] when there is one row, and onnxruntime-web fuses norm + gate + up
    with biases + SiLU x up into one kernel (MatMulNBitsMlpFusion), where the Adds of the 2-D form stop it:
    three dispatches fewer a layer. q, k and v keep their Adds: MatMulNBitsQkvFusion takes no bias. Returns
    how many updates moved."""
    mlp = DOWN_GROUPS["gate_up_proj"]
    return sum(_as_bias(graph, add) for add in [n for n in graph
                                                if n.op_type == "Add" and _branch_part(n.name, mlp) == "out2"])


def _as_bias(graph: ir.Graph, add: ir.Node) -> bool:
    """Add(delta, Reshape(y)) -> Reshape -> readers becomes y = MatMulNBits(..., bias=Reshape(delta, [out]))."""
    delta, y2 = (v.producer() if v is not None else None for v in add.inputs)
    proj = y2.inputs[0].producer() if y2 is not None and y2.inputs[0] is not None else None
    back = [u for u, _ in add.outputs[0].uses()]
    if delta is None or y2 is None or proj is None or proj.op_type != "MatMulNBits" or len(proj.inputs) > 5 \
            or len(back) != 1:
        return False
    n_out = _dims(proj)[1]
    dtype = add.outputs[0].type.dtype if add.outputs[0].type is not None else ir.DataType.FLOAT
    name = f"{(delta.name or 'lora').removesuffix('/delta')}/bias"
    bias = Builder(graph, PREFIX).reshape(delta.outputs[0], [n_out], name, dtype, [n_out])
    graph.remove(delta)
    graph.insert_before(proj, [delta, bias])  # after the down it reads, before the projection
    proj.resize_inputs(6)
    proj.replace_input_with(5, bias.outputs[0])
    ir.convenience.replace_all_uses_with(back[0].outputs[0], proj.outputs[0])
    graph.remove([back[0], add, y2], safe=True)
    return True


def merged_deltas(graph: ir.Graph) -> int:
    """In a one-token step graph, after mlp_updates_as_biases: each DELTA_GROUPS member's bias (its update, low @ up)
    becomes one 4-bit MatMulNBits of the group's norm copy and the update's merged weights, graph inputs
    `lora.{i}.{proj}.delta_codes` uint8 [out, blocks, 16] and `.delta_scales` [out, blocks] (blocks of 32 along
    `in`: adapter_pack.quantize_blocks of down @ up, which the page computes at a switch with the delta graph,
    webbuild.forms.lora_delta). Gate's and up's are of one width, so with one spare of another width
    (spare_readers) the norm copy and both are one fused kernel (MatMulNBitsQkvFusion): one dispatch a layer where
    the norm with the 4-bit down and the two up MatMuls were three. The price is bandwidth: the merged weights are
    as many as the projections' own (4-bit), read every token. The down, its ups and the nodes left unread go with
    dead_code_elimination and drop_unread_inputs. Returns how many updates merged."""
    members = tuple(p for g in DELTA_GROUPS for p in DOWN_GROUPS[g])
    return sum(_merge(graph, n) for n in list(graph) if _branch_part(n.name, members) == "bias")


def _merge(graph: ir.Graph, bias: ir.Node) -> bool:
    """bias = Reshape(MatMul(MatMul(Reshape(norm), down), up)) -> Reshape(MatMulNBits(norm, delta codes, scales))."""
    delta = bias.inputs[0].producer() if bias.inputs[0] is not None else None
    low = delta.inputs[0].producer() if delta is not None and delta.inputs[0] is not None else None
    rows = low.inputs[0].producer() if low is not None and low.inputs[0] is not None else None
    x = rows.inputs[0] if rows is not None and rows.op_type == "Reshape" else None
    norm = x.producer() if x is not None else None
    up = delta.inputs[1] if delta is not None else None
    n_in = x.shape[-1] if x is not None and x.shape is not None else None
    n_out = up.shape[-1] if up is not None and up.shape is not None else None
    # blocks of 32 along `in` with no padding: the delta graph's Reshape to [out, -1, 32]
    if norm is None or norm.op_type not in NORMS or not isinstance(n_in, int) or n_in % INT8_BLOCK \
            or not isinstance(n_out, int):
        return False
    assert x is not None and x.shape is not None, "a value of static width"
    _, layer, proj, _ = (bias.name or "").split("/")
    group = next(g for g in DELTA_GROUPS if proj in DOWN_GROUPS[g])
    sources = [(group, "down"), (proj, "up")]
    record = {"kind": "delta", "from": [IO.lora_input(int(layer), *s) for s in sources],
              "delta": {"run": int(layer), "from": [delta_name(*s) for s in sources]}}
    merged = _nbits_of_inputs(graph, x, _factor_inputs(int(layer), proj, DELTA_CODES, DELTA_SCALES), n_in, n_out,
                              DELTA_BITS, f"lora/{layer}/{proj}/delta4", [*x.shape[:-1], n_out], record=record)
    graph.insert_before(bias, [merged])
    bias.replace_input_with(0, merged.outputs[0])
    return True


def _back_shape(y: ir.Value, n_out: int) -> list[int]:
    """y's shape as Reshape's constant: its leading dims 1 (the batch: every runtime decodes one sequence),
    the rows' -1 and the width."""
    rank = len(y.shape) if y.shape is not None else 3
    return [1] * (rank - 2) + [-1, n_out]


def _dims(node: ir.Node) -> tuple[int, int]:
    """(in, out) features of a projection."""
    if node.op_type == "MatMulNBits":
        return node.attributes["K"].as_int(), node.attributes["N"].as_int()
    w = node.inputs[1]
    assert w is not None and w.shape is not None, "a MatMul projection's weight is an initializer"
    k, n = w.shape.numpy()
    return int(k), int(n)


def _layout_input(graph: ir.Graph, name: str, dtype: ir.DataType, dims: list,
                  record: dict | None = None) -> ir.Value:
    """A graph input of shape `dims`, with no default (see the module's docstring); `record`: its layout record
    (step_layout), of these dims unless it names its own."""
    meta = {LAYOUT: {"dims": dims} | record} if record is not None else None
    return Builder(graph, PREFIX).input(name, dtype, dims, meta)


def _delta_part(record: dict, name: str) -> dict:
    """A merged update's input's name in the delta graph (webbuild.forms.lora_delta), in its record's `delta`."""
    if "delta" not in record:
        return {}
    layer, proj, factor = IO.lora_parts(name) or (0, "", "")
    return {"delta": record["delta"] | {"to": delta_name(proj, factor)}}


def step_layout(model: ir.Model) -> dict[str, dict]:
    """{input: record} of every lora input of an adapted step graph, in input order: what the page, the Python
    packer (webbuild.site.adapter_pack.step_inputs) and the check stage read to make each input from an adapter's
    tensors (docs/adapters.md, "The step layout"). The passes that make an input give it its record; an input
    that none made (a down or up as the adapted graph reads it) is the adapter's tensor itself, kind `float`."""
    layout = {}
    for v in model.graph.inputs:
        parts = IO.lora_parts(v.name or "")
        if parts is not None:
            layout[v.name or ""] = v.meta.get(LAYOUT) or _float_record(v, parts)
    return layout


def _float_record(v: ir.Value, parts: tuple[int, str, str]) -> dict:
    """The record of an input that is an adapter's tensor as it is: its dims with the group's rank for R."""
    _, owner, _ = parts
    group = next((g for g, projs in DOWN_GROUPS.items() if owner in projs or owner == g), owner)
    dims = [d if isinstance(d, int) else shared_rank(group) for d in (v.shape or [])]
    return {"kind": "float", "part": "values", "dims": dims, "from": [v.name or ""]}


_MLP = DOWN_GROUPS["gate_up_proj"]
_DELTA_MEMBERS = tuple(p for g in DELTA_GROUPS for p in DOWN_GROUPS[g])
STEP_PASSES = (
    StepPass("mlp_updates_as_biases", lambda g: _branches(g, "out2", _MLP), lambda m: mlp_updates_as_biases(m.graph),
             "gate's and up's updates stay Adds after their projections (no fused MLP kernel)"),
    StepPass("packed_updates", lambda g: _branches(g, "low", PACKED_UPS), lambda m: packed_updates(m.graph),
             "q, k and v stay three projections with their updates beside them", leaves_unread=True),
    StepPass("joint_downs", lambda g: _branches(g, "low", JOINT_DOWNS), joint_downs,
             "o's and down's downs stay beside their projections (not plain MatMulNBits of external weights)",
             leaves_unread=True),
    StepPass("merged_deltas", lambda g: _branches(g, "bias", _DELTA_MEMBERS), lambda m: merged_deltas(m.graph),
             "gate's and up's updates stay down @ up each step", leaves_unread=True),
    StepPass("quantized_downs", lambda g: _branches(g, "low", tuple(DOWN_GROUPS)), lambda m: quantized_downs(m.graph),
             "the downs stay float MatMuls of one row", reads_tidy=True),
)

"""Small onnx-ir helpers shared by the rules: walk producers, read constants, swap values."""

from __future__ import annotations

import itertools

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common  # noqa: F401  (registers ir.passes.common)

from webbuild.graph.census import op_census as census  # noqa: F401  (the rules' name for it)

MS = "com.microsoft"
_ids = itertools.count()


def prod(v: ir.Value | None, *ops: str) -> ir.Node | None:
    """The node producing `v` if its op_type is one of `ops` (any op when none given)."""
    n = v.producer() if v is not None else None
    return n if n is not None and (not ops or n.op_type in ops) else None


def producer_of(v: ir.Value) -> ir.Node:
    """The node computing `v`, a value a rule matched as an op's output (so not a graph input)."""
    n = v.producer()
    if n is None:
        raise ValueError(f"{v.name!r} is not computed by a node")
    return n


def const(v: ir.Value | None) -> np.ndarray | None:
    if v is None:
        return None
    t = ir.convenience.get_const_tensor(v)
    return None if t is None else t.numpy()


def const_input(node: ir.Node, i: int) -> np.ndarray:
    """Input i of `node`, a constant its op requires (a norm's scale, GQA's cos/sin caches)."""
    c = const(node.inputs[i]) if len(node.inputs) > i else None
    if c is None:
        raise ValueError(f"{node.op_type} {node.name!r}: input {i} is not a constant")
    return c


def scalar(v: ir.Value | None) -> float | None:
    c = const(v)
    return float(c.reshape(-1)[0]) if c is not None and c.size == 1 else None


def other(node: ir.Node, v: ir.Value | None) -> ir.Value | None:
    """The other operand of a binary node, or None when `v` is not an operand."""
    a, b = node.inputs[0], node.inputs[1]
    return b if a is v else a if b is v else None


def scalar_operand(node: ir.Node) -> tuple[ir.Value, float] | None:
    """(tensor operand, scalar constant) of a binary node whose one side is a scalar constant."""
    for x, c in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
        s = scalar(c)
        if s is not None and x is not None and const(x) is None:
            return x, s
    return None


def only_user(v: ir.Value, *ops: str) -> ir.Node | None:
    """The single consumer of `v` when it has exactly one and its op is in `ops`."""
    users = list(v.consumers())
    if len(users) != 1 or v.is_graph_output():
        return None
    return users[0] if not ops or users[0].op_type in ops else None


def attr(node: ir.Node, name: str, default=None):
    a = node.attributes.get(name)
    return default if a is None else a.value


def axes_of(node: ir.Node) -> list[int] | None:
    """Axes of a Reduce*/Unsqueeze/Squeeze node: attribute (old opsets) or constant input."""
    a = attr(node, "axes")
    if a is not None:
        return list(a)
    c = const(node.inputs[1]) if len(node.inputs) > 1 else None
    return None if c is None else [int(x) for x in c.reshape(-1)]


def new_const(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    """Register `array` as an initializer named after `name` (made unique)."""
    taken = set(graph.initializers)
    unique = name if name not in taken else f"{name}_{next(_ids)}"
    v = ir.Value(name=unique, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                 const_value=ir.tensor(array, name=unique))
    graph.register_initializer(v)
    return v


def shared_const(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    """An initializer named `name` holding `array`, reused when one with equal contents exists."""
    v = graph.initializers.get(name)
    if v is not None and v.const_value is not None and np.array_equal(v.const_value.numpy(), array):
        return v
    return new_const(graph, name, array)


def replace(old: ir.Value, new: ir.Value) -> None:
    """Point every use of `old` at `new`; a graph output keeps its name (and so the model's I/O names)."""
    name, was_output = old.name, old.is_graph_output()
    ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
    if was_output:
        old.name = f"{name}__replaced{next(_ids)}"
        new.name = name


def width(v: ir.Value) -> int | None:
    """Static size of the last axis of `v`, read from its shape or from the op that makes it."""
    if v.shape is not None and len(v.shape) and isinstance(v.shape[-1], int):
        return v.shape[-1]
    n = prod(v)
    if n is None:
        return None
    if n.op_type == "MatMul":
        w = const(n.inputs[1])
        return None if w is None else int(w.shape[-1])
    if n.op_type == "MatMulNBits":
        return int(attr(n, "N"))
    if n.op_type == "Split" and attr(n, "axis", 0) == -1 and len(n.inputs) > 1:
        sizes = const(n.inputs[1])
        return None if sizes is None else int(sizes[v.index()])
    if n.op_type == "Add":
        for x in n.inputs:
            c = const(x)
            if c is not None and c.ndim == 1:
                return int(c.shape[0])
            if c is None and x is not None and width(x):
                return width(x)
    return None


def dead_code_elimination(model: ir.Model) -> None:
    ir.passes.common.RemoveUnusedNodesPass()(model)
    ir.passes.common.TopologicalSortPass()(model)


def import_ms_domain(graph: ir.Graph) -> None:
    """Contrib ops need the com.microsoft opset imported."""
    graph.opset_imports.setdefault(MS, 1)


def nodes_per_layer(model: ir.Model) -> int | None:
    """Nodes (Constant excluded) from one GroupQueryAttention up to the next: one decoder layer's
    worth in a layer-ordered graph; None with fewer than two GQA nodes."""
    nodes = [n for n in model.graph if n.op_type != "Constant"]
    at = [i for i, n in enumerate(nodes) if n.op_type == "GroupQueryAttention"]
    return at[1] - at[0] if len(at) > 1 else None


def sort_nodes(model: ir.Model) -> int:
    """Put the nodes of `model`'s graph and its subgraphs in topological order (stable: a sorted graph stays as
    it is); returns how many came before a node making one of their inputs. onnxruntime loads graphs out of
    order (onnxruntime's float16 converter with keep_io_types=True writes them: input casts after their
    users); onnx's checker and the rules' pattern matching want the order. A cycle is a ValueError."""
    early = 0
    for graph in (model.graph, *model.graph.subgraphs()):
        seen: set[ir.Node] = set()
        for node in graph:
            makers = (v.producer() for v in node.inputs if v is not None)
            early += any(m is not None and m.graph is graph and m not in seen for m in makers)
            seen.add(node)
    if early:
        model.graph.sort()
    return early

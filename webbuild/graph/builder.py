"""The one way graph pieces are built (by the graph forms, the fusion rules' helpers and the decomposition): nodes,
constants and inputs on an onnx-ir graph.

A `Builder` makes nodes for one graph: each node named (explicitly, empty, or `<prefix><op>_<n>`: n counts the
builder's nodes), each output named or left for the graph to name, and declared with its element type and shape where
the caller knows them; constants are initializers named under the builder's `const_prefix` (its `prefix` unless
given), shared between equal ones; inputs are graph inputs with their type, shape and any `meta` a later pass reads.
The nodes are not placed: a rewrite inserts them where they belong (`graph.insert_before`, `insert_after`), or
`place()` appends all it made. `new_model` starts a model from nothing, whose graph a Builder then fills.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
from numpy.typing import ArrayLike

from webbuild.graph.ir import shared_const

Dims = Sequence[int | str | ir.SymbolicDim | None] | ir.Shape


class Builder:
    """Nodes, constants and inputs for `graph`, named under `prefix`; constants under `const_prefix` where given
    (several builders sharing the graph's constants). `typed_consts` False leaves the constants' type and shape to
    their tensors (no value_info for them in the file, as onnx.helper writes a model)."""

    def __init__(self, graph: ir.Graph, prefix: str = "", typed_consts: bool = True, const_prefix: str | None = None):
        self.graph, self.prefix, self.typed_consts = graph, prefix, typed_consts
        self.const_prefix = prefix if const_prefix is None else const_prefix
        self.nodes: list[ir.Node] = []

    def node(self, op: str, inputs: Sequence[ir.Value | None], name: str | None = None,
             outputs: Sequence[ir.Value] | int = 1, domain: str = "", **attrs: Any) -> ir.Node:
        """A node of `op` named `name` (None: `<prefix><op>_<n>`, n counting this builder's nodes; "" stays
        unnamed), with `outputs` (values, or how many unnamed ones) and attributes `attrs` in the order given."""
        made = [ir.Value() for _ in range(outputs)] if isinstance(outputs, int) else list(outputs)
        node = ir.node(op, list(inputs), attrs, name=f"{self.prefix}{op}_{len(self.nodes)}" if name is None else name,
                       outputs=made, domain=domain)
        self.nodes.append(node)
        return node

    def op(self, op: str, inputs: Sequence[ir.Value | None], dtype: ir.DataType | None = None,
           dims: Dims | None = None, name: str | None = None, output: str | None = None, domain: str = "",
           **attrs: Any) -> ir.Value:
        """The one output of a new node (see `node`; unnamed, the node is `<prefix><output or op>_<n>`): named
        `output` (None: the graph names it), declared as `dims` of `dtype` where given."""
        if name is None:
            name = f"{self.prefix}{output or op}_{len(self.nodes)}"
        return self.node(op, inputs, name, [value(output, dtype, dims)], domain, **attrs).outputs[0]

    def named(self, op: str, inputs: Sequence[ir.Value | None], name: str, dtype: ir.DataType | None,
              dims: Dims | None, domain: str = "", **attrs: Any) -> ir.Node:
        """A node named `name` whose one output is named `name` too, declared as `dims` of `dtype`."""
        return self.node(op, inputs, name, [value(name, dtype, dims)], domain, **attrs)

    def const(self, name: str, array: ArrayLike) -> ir.Value:
        """An initializer `<const_prefix><name>` holding `array`, shared with an equal one of that name."""
        full, array = f"{self.const_prefix}{name}", np.asarray(array)
        if self.typed_consts:
            return shared_const(self.graph, full, array)
        v = ir.Value(name=full, const_value=ir.tensor(np.asarray(array), name=full))
        self.graph.register_initializer(v)
        return v

    def input(self, name: str, dtype: ir.DataType, dims: Dims, meta: dict | None = None) -> ir.Value:
        """A graph input without a default, `meta` kept on the value for later passes."""
        v = value(name, dtype, dims)
        v.meta.update(meta or {})
        self.graph.inputs.append(v)
        return v

    def reshape(self, x: ir.Value, shape: Sequence[int], name: str, dtype: ir.DataType | None,
                dims: Dims | None) -> ir.Node:
        """Reshape `x` to the constant `shape` (one initializer `<const_prefix>shape_<dims>` for every such
        Reshape), the node and its output both named `name`."""
        to = self.const(f"shape_{'_'.join(str(d) for d in shape)}", np.array(shape, np.int64))
        return self.named("Reshape", [x, to], name, dtype, dims)

    def place(self) -> None:
        """Append every node made so far to the graph's end, in the order made."""
        self.graph.extend(self.nodes)
        self.nodes = []


def value(name: str | None, dtype: ir.DataType | None = None, dims: Dims | None = None) -> ir.Value:
    """A value named `name`, declared as `dims` of `dtype` where given (each part left unknown where None)."""
    return ir.Value(name=name, type=ir.TensorType(dtype) if dtype is not None else None,
                    shape=ir.Shape(list(dims)) if dims is not None else None)


def new_model(name: str, opset: int, ir_version: int, producer: str | None = None) -> ir.Model:
    """An empty model whose graph `name` imports the default domain at `opset`."""
    graph = ir.Graph([], [], nodes=[], opset_imports={"": opset}, name=name)
    return ir.Model(graph, ir_version=ir_version, producer_name=producer)

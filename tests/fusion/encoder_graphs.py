"""Small hand-built encoder pieces for the encoder rules: spellings the zoo does not emit, negatives."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper

if TYPE_CHECKING:
    from webbuild.fusion.rule_report import Report

H = 16
_rng = np.random.default_rng(0)


def _model(nodes, inputs, outputs, inits, opset=18) -> ir.Model:
    g = helper.make_graph(nodes, "enc", inputs, outputs, inits)
    return ir.from_proto(helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", opset)]))


def _f(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _c(name, value):
    return onnx.numpy_helper.from_array(np.asarray(value, np.float32), name)


def _w(name, *shape, scale=0.3):
    return onnx.numpy_helper.from_array((_rng.standard_normal(shape) * scale).astype(np.float32), name)


def gelu_graph(order: str, inner: str = "div", half: float = 0.5, bias: str | None = None) -> ir.Model:
    """y = gelu(x) spelt with Erf. order: 'x_first' ((x * (1+erf)) * 0.5), 'half_first'
    (x * (0.5 * (1+erf))), 'x_half' ((x * 0.5) * (1+erf)); inner: 'div' (x / sqrt2) or 'mul'
    (x * 1/sqrt2). bias: None, 'add' (x = MatMul + Add(b)) or 'gemm' (x = Gemm with C)."""
    nodes, inits = [], [_c("sqrt2", math.sqrt(2)), _c("inv_sqrt2", 1 / math.sqrt(2)), _c("one", 1.0), _c("half", half)]
    x = "x"
    if bias == "add":
        inits += [_w("w", H, H), _w("b", H)]
        nodes += [helper.make_node("MatMul", ["a", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["x"])]
    elif bias == "gemm":
        inits += [_w("w", H, H), _w("b", H)]
        nodes.append(helper.make_node("Gemm", ["a", "w", "b"], ["x"], transB=1))
    if inner == "div":
        nodes.append(helper.make_node("Div", [x, "sqrt2"], ["s"]))
    else:
        nodes.append(helper.make_node("Mul", ["inv_sqrt2", x], ["s"]))
    nodes += [helper.make_node("Erf", ["s"], ["e"]), helper.make_node("Add", ["e", "one"], ["p"])]
    if order == "x_first":
        nodes += [helper.make_node("Mul", [x, "p"], ["xp"]), helper.make_node("Mul", ["xp", "half"], ["y"])]
    elif order == "half_first":
        nodes += [helper.make_node("Mul", ["half", "p"], ["hp"]), helper.make_node("Mul", [x, "hp"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", [x, "half"], ["xh"]), helper.make_node("Mul", ["xh", "p"], ["y"])]
    src = "x" if bias is None else "a"
    return _model(nodes, [_f(src, ["s", H])], [_f("y", ["s", H])], inits)


def layer_norm_graph(square: str = "pow", divide: str = "div", affine: bool = True, axis: int = -1,
                     opset: int = 18) -> ir.Model:
    """y = LayerNorm(x) over `axis`, decomposed: square 'pow' | 'mul', divide 'div' | 'recip'."""
    inits = [_c("two", 2.0), _c("eps", 1e-5), onnx.numpy_helper.from_array(np.array([axis], np.int64), "axes"),
             _w("gamma", H, scale=1.0), _w("beta", H)]
    if square == "pow":
        sq = helper.make_node("Pow", ["d", "two"], ["sq"])
    else:
        sq = helper.make_node("Mul", ["d", "d"], ["sq"])
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["mean"], keepdims=1),
             helper.make_node("Sub", ["x", "mean"], ["d"]),
             sq,
             helper.make_node("ReduceMean", ["sq", "axes"], ["var"], keepdims=1),
             helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["std"])]
    if divide == "div":
        nodes.append(helper.make_node("Div", ["d", "std"], ["n"]))
    else:
        nodes += [helper.make_node("Reciprocal", ["std"], ["r"]), helper.make_node("Mul", ["d", "r"], ["n"])]
    if affine:
        nodes += [helper.make_node("Mul", ["n", "gamma"], ["ng"]), helper.make_node("Add", ["ng", "beta"], ["y"])]
    else:
        nodes.append(helper.make_node("Identity", ["n"], ["y"]))
    if opset < 18:  # ReduceMean takes axes as an attribute before opset 18
        for n in nodes:
            if n.op_type == "ReduceMean":
                n.input.pop()
                n.attribute.append(helper.make_attribute("axes", [axis]))
    return _model(nodes, [_f("x", [2, 5, H])], [_f("y", [2, 5, H])], inits, opset)


def residual_graph(bias: str | None = None, constant_skip: bool = False, broadcast: bool = False) -> ir.Model:
    """h = a + proj(b) -> LayerNormalization -> y; out = h + y (the residual goes on).
    bias: None (proj = MatMul), 'add' (MatMul + Add(b)), 'gemm' (Gemm with C)."""
    inits = [_w("w", H, H), _w("bias", H), _w("gamma", H, scale=1.0), _w("beta", H)]
    if bias == "gemm":
        nodes = [helper.make_node("Gemm", ["b", "w", "bias"], ["p"], transB=1)]
    else:
        nodes = [helper.make_node("MatMul", ["b", "w"], ["mm" if bias == "add" else "p"])]
        nodes += [helper.make_node("Add", ["mm", "bias"], ["p"])] if bias == "add" else []
    other = "bias" if constant_skip else "a"
    nodes += [helper.make_node("Add", [other, "p"], ["h"]),
              helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5),
              helper.make_node("Add", ["h", "y"], ["out"])]
    a_shape = [1, "s", H] if broadcast else ["s", H]
    out_shape = ["s", H] if not broadcast else [1, "s", H]
    return _model(nodes, [_f("a", a_shape), _f("b", ["s", H])], [_f("out", out_shape)], inits)


def attention_graph(layout: str = "batch", heads: int = 2, mask: bool = True, scale_on: str = "scores",
                    softmax_axis: int = -1, cross: bool = False, runtime_hd: bool = False) -> ir.Model:
    """softmax(Q_h K_h^T * scale + mask) V_h merged back. layout 'batch' ([B, S, H], heads split to
    [B, heads, S, hd]) or 'nobatch' ([S, H] -> [heads, S, hd]); scale_on: 'scores' | 'q' | 'v' (bad);
    cross: K and V project a second input `kv_in` (same shape as x); runtime_hd: the split's head size
    is an input `hd` ([1] int64) concatenated to the constant part, as a shape computed at run time."""
    hd = H // heads
    batch = layout == "batch"
    split = [0, 0, heads, hd] if batch else [-1, heads, hd]
    inits = [_w("wq", H, H), _w("wk", H, H), _w("wv", H, H), _c("scale", 1 / math.sqrt(hd)),
             onnx.numpy_helper.from_array(np.array(split[:-1] if runtime_hd else split, np.int64),
                                          "split_heads" if runtime_hd else "split"),
             onnx.numpy_helper.from_array(np.array([0, 0, H] if batch else [-1, H], np.int64), "merge")]
    qv_perm, k_perm = ([0, 2, 1, 3], [0, 2, 3, 1]) if batch else ([1, 0, 2], [1, 2, 0])
    nodes = [helper.make_node("MatMul", ["kv_in" if cross and n != "q" else "x", f"w{n}"], [f"{n}p"]) for n in "qkv"]
    if runtime_hd:
        nodes.append(helper.make_node("Concat", ["split_heads", "hd"], ["split"], axis=0))
    scaled = {"q": "qp", "v": "vp"}
    if scale_on in ("q", "v"):
        nodes.append(helper.make_node("Mul", [f"{scale_on}p", "scale"], [f"{scale_on}s"]))
        scaled[scale_on] = f"{scale_on}s"
    nodes += [helper.make_node("Reshape", [scaled["q"], "split"], ["qr"]),
              helper.make_node("Transpose", ["qr"], ["qh"], perm=qv_perm),
              helper.make_node("Reshape", ["kp", "split"], ["kr"]),
              helper.make_node("Transpose", ["kr"], ["kt"], perm=k_perm),
              helper.make_node("Reshape", [scaled["v"], "split"], ["vr"]),
              helper.make_node("Transpose", ["vr"], ["vh"], perm=qv_perm),
              helper.make_node("MatMul", ["qh", "kt"], ["qk"])]
    scores = "qk"
    if scale_on == "scores":
        nodes.append(helper.make_node("Mul", ["qk", "scale"], ["sc"]))
        scores = "sc"
    if mask:
        nodes.append(helper.make_node("Add", [scores, "mask"], ["sm_in"]))
        scores = "sm_in"
    nodes += [helper.make_node("Softmax", [scores], ["probs"], axis=softmax_axis),
              helper.make_node("MatMul", ["probs", "vh"], ["pv"]),
              helper.make_node("Transpose", ["pv"], ["pt"], perm=qv_perm),
              helper.make_node("Reshape", ["pt", "merge"], ["y"])]
    x_shape = ["b", "s", H] if batch else ["s", H]
    inputs = [_f("x", x_shape), *([_f("kv_in", x_shape)] if cross else []), *([_f("mask", ["s", "s"])] if mask else []),
              *([helper.make_tensor_value_info("hd", TensorProto.INT64, [1])] if runtime_hd else [])]
    return _model(nodes, inputs, [_f("y", x_shape)], inits)


def window_mask(s: int, window: int) -> np.ndarray:
    """The zoo's block-diagonal window mask: 0 inside a window, -1e9 across."""
    w = np.arange(s) // window
    return np.where(w[:, None] == w[None, :], 0.0, -1e9).astype(np.float32)


def apply_rules(m: ir.Model, *rules) -> tuple[list[int], Report]:
    """Run rules (model, report) -> count in order on a shape-inferred graph, dead code dropped after
    each, as the driver does (its cleanup infers shapes first)."""
    import onnx_ir.passes.common as common

    from webbuild.fusion.rule_report import Report
    from webbuild.graph.ir import dead_code_elimination

    common.ShapeInferencePass()(m)
    report, counts = Report(), []
    for rule in rules:
        counts.append(rule(m, report))
        dead_code_elimination(m)
    return counts, report

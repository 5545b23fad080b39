"""Small hand-built graphs for the rules' edge cases (spellings the zoo does not emit, negatives)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper

H = 16


def rms_graph(spelling: str, axis: int = -1, weight: bool = True, eps: float = 1e-6) -> ir.Model:
    """y = RMSNorm(x) over `axis`, in one of: 'div1' (x * 1/sqrt), 'recip' (x * Reciprocal(sqrt)),
    'divx' (x / sqrt), 'mulsq' (x*x instead of Pow)."""
    rng = np.random.default_rng(0)
    inits = [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
             helper.make_tensor("eps", TensorProto.FLOAT, [], [eps]),
             helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
             helper.make_tensor("axes", TensorProto.INT64, [1], [axis]),
             onnx.numpy_helper.from_array(rng.standard_normal(H).astype(np.float32), "w")]
    if spelling == "mulsq":
        sq = helper.make_node("Mul", ["x", "x"], ["sq"])
    else:
        sq = helper.make_node("Pow", ["x", "two"], ["sq"])
    nodes = [sq, helper.make_node("ReduceMean", ["sq", "axes"], ["m"], keepdims=1),
             helper.make_node("Add", ["m", "eps"], ["me"]), helper.make_node("Sqrt", ["me"], ["s"])]
    if spelling == "divx":
        nodes.append(helper.make_node("Div", ["x", "s"], ["n"]))
    elif spelling == "recip":
        nodes += [helper.make_node("Reciprocal", ["s"], ["r"]), helper.make_node("Mul", ["x", "r"], ["n"])]
    else:
        nodes += [helper.make_node("Div", ["one", "s"], ["r"]), helper.make_node("Mul", ["r", "x"], ["n"])]
    nodes.append(helper.make_node("Mul", ["w", "n"], ["y"]) if weight else helper.make_node("Identity", ["n"], ["y"]))
    g = helper.make_graph(nodes, "rms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 3, H])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 3, H])], inits)
    return ir.from_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))


def residual_graph(bias: bool) -> ir.Model:
    """h = a + (b or a constant bias); y = RMSNorm(h) * w; out = h + y (the residual continues)."""
    m = rms_graph("recip")
    g = m.graph
    x = g.inputs[0]
    a = ir.Value(name="a", shape=ir.Shape(["b", 3, H]), type=ir.TensorType(ir.DataType.FLOAT))
    g.inputs.append(a)
    other = ir.Value(name="bias", const_value=ir.tensor(np.ones(H, np.float32), name="bias")) if bias else a
    if bias:
        g.register_initializer(other)
    b = ir.Value(name="b_in", shape=ir.Shape(["b", 3, H]), type=ir.TensorType(ir.DataType.FLOAT))
    g.inputs.append(b)
    add = ir.node("Add", [b, other], name="residual_add")
    g.insert_before(g.node(0), add)
    ir.convenience.replace_all_uses_with(x, add.outputs[0])
    g.inputs.remove(x)
    y = g.outputs[0]
    out = ir.node("Add", [add.outputs[0], y], name="next_residual")
    g.append(out)
    out.outputs[0].name = "out"
    out.outputs[0].shape, out.outputs[0].type = y.shape, y.type
    g.outputs[0] = out.outputs[0]
    return m


def run(model: ir.Model, feeds: dict, optimize: bool = True) -> list[np.ndarray]:
    """`optimize=False` keeps onnxruntime from rewriting the graph first (it turns DequantizeLinear +
    MatMul into MatMulNBits with int8 activations, which is not the graph under test)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(ir.to_proto(model).SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def packed_lookup_graph(bits: int = 4, tied: bool = True, zero_points: bool = False, vocab: int = 4096,
                        hidden: int = 64, ffn: int = 48, block: int = 16, seed: int = 0) -> ir.Model:
    """What the build ships, in small: ids -> GatherBlockQuantized lookup (webbuild.graph.packing's layout)
    -> Reshape -> embeds; hidden = MatMulNBits(embeds) [ffn]; logits = lm_head MatMulNBits(embeds), reading
    the lookup's bytes and scales (through a Reshape) when `tied`, else the lookup has its own table and
    scales [V, blocks, 1] (webbuild.quantize.embeddings' two forms). vocab * hidden / block > 8192 keeps
    the scales' Reshape out of constant folding's reach, as for a real table."""
    from webbuild.graph.packing import LOOKUP_ATTRS, lookup_scales_shape, n_blocks, pack_codes

    rng = np.random.default_rng(seed)
    top = 2 ** bits
    inits: dict[str, np.ndarray] = {}

    def weight(name: str, rows: int, k: int) -> list[str]:
        blocks = n_blocks(k, block)
        inits[name + ".B"] = pack_codes(rng.integers(0, top, (rows, blocks * block)), bits).reshape(rows, blocks, -1)
        inits[name + ".scales"] = (rng.random((rows, blocks)) * 0.1 + 0.01).astype(np.float32)
        names = [name + ".B", name + ".scales"]
        if zero_points:
            inits[name + ".zp"] = pack_codes(rng.integers(0, top, (rows, blocks)), bits).reshape(-1)
            names.append(name + ".zp")
        return names

    def mnb(a: str, w: list[str], out: str, k: int, n: int):
        return helper.make_node("MatMulNBits", [a, *w], [out], name=out, domain="com.microsoft", K=k, N=n,
                                bits=bits, block_size=block, accuracy_level=0)

    shape = lookup_scales_shape(vocab, hidden, block)
    lm = weight("lm_head", vocab, hidden)
    inits["embeds_shape"] = np.array([0, 0, hidden])
    nodes = []
    if tied:
        inits["scales_shape"] = np.array(shape)
        nodes.append(helper.make_node("Reshape", [lm[1], "scales_shape"], ["table_scales"], name="scales"))
        lookup = [lm[0], "ids", "table_scales"]
    else:
        table = weight("table", vocab, hidden)
        for name in table[1:]:
            inits.pop(name)
        inits["table_scales"] = (rng.random(shape) * 0.1 + 0.01).astype(np.float32)
        lookup = [table[0], "ids", "table_scales"]
    if zero_points:  # the lookup's zero points: one byte a block (those of lm_head when tied)
        zp = inits[lm[2]] if tied else pack_codes(rng.integers(0, top, (vocab, shape[1])), bits).reshape(-1)
        codes = np.stack([zp & 15, zp >> 4], -1).reshape(vocab, -1) if bits == 4 else zp.reshape(vocab, -1)
        inits["table_zp"] = codes[:, :shape[1]].astype(np.uint8).reshape(shape)
        lookup.append("table_zp")
    nodes += [
        helper.make_node("GatherBlockQuantized", lookup, ["blocks"], name="lookup", domain="com.microsoft",
                         bits=bits, block_size=block, **LOOKUP_ATTRS),
        helper.make_node("Reshape", ["blocks", "embeds_shape"], ["embeds"], name="embeds"),
        mnb("embeds", weight("mlp", ffn, hidden), "hidden", hidden, ffn),
        mnb("embeds", lm, "logits", hidden, vocab),
    ]
    graph = helper.make_graph(
        nodes, "packed_lookup", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [2, 3, ffn]),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 3, vocab])],
        [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    return ir.from_proto(model)


INT_CODES = {"int4": (4, True), "uint4": (4, False), "int8": (8, True), "uint8": (8, False)}


def dequantized_weight(rows: int, cols: int, axis: int, block: int, dtype: str, zero_point: bool, spelling: str,
                       seed: int = 0) -> tuple[list, list, ir.Value, np.ndarray]:
    """A float [rows, cols] matrix blocked along `axis`, spelt as `spelling`:
    "dq2": DequantizeLinear on the 2-D codes; "dq3": DequantizeLinear on 3-D codes, one block along the
    blocked axis' inner part, then Reshape (the WebNN EP's); "cast": Cast -> Sub (zero point) -> Mul (scale)
    on those 3-D codes, then Reshape. Returns (nodes, initializers, the float value, the matrix in numpy)."""
    import ml_dtypes

    bits, signed = INT_CODES[dtype]
    np_type = {"int4": ml_dtypes.int4, "uint4": ml_dtypes.uint4, "int8": np.int8, "uint8": np.uint8}[dtype]
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1)) if signed else (0, 2 ** bits)
    rng = np.random.default_rng(seed)
    blocks = -(-(cols if axis == 1 else rows) // block)
    q = rng.integers(lo, hi, (rows, cols))
    s_shape = (rows, blocks) if axis == 1 else (blocks, cols)
    scale = (rng.random(s_shape) * 0.1 + 0.01).astype(np.float32)
    zero = rng.integers(lo, hi, s_shape) if zero_point else np.zeros(s_shape, np.int64)
    expand = (lambda a: np.repeat(a, block, axis=1)[:, :cols]) if axis == 1 else \
        (lambda a: np.repeat(a, block, axis=0)[:rows])
    want = ((q - expand(zero)) * expand(scale)).astype(np.float32)
    tag = f"w{seed}"

    def c(name, array):
        return ir.Value(name=f"{tag}.{name}", const_value=ir.tensor(np.ascontiguousarray(array), name=f"{tag}.{name}"))

    if spelling == "dq2":
        inits = [c("q", q.astype(np_type)), c("s", scale)] + ([c("z", zero.astype(np_type))] if zero_point else [])
        dq = ir.node("DequantizeLinear", inits, {"axis": axis, "block_size": block})
        return [dq], inits, dq.outputs[0], want
    # 3-D: [rows, blocks, block] (axis 1) or [blocks, block, cols] (axis 0); the blocked length divides
    if axis == 1:
        q3, s3, z3 = q.reshape(rows, blocks, block), scale[..., None], zero[..., None]
    else:
        q3, s3, z3 = q.reshape(blocks, block, cols), scale[:, None], zero[:, None]
    inits = [c("q", q3.astype(np_type)), c("s", s3)]
    if spelling == "dq3":
        if zero_point:
            inits.append(c("z", z3.astype(np_type)))
        nodes = [ir.node("DequantizeLinear", inits, {"axis": 2 if axis == 1 else 1, "block_size": block})]
    else:
        nodes = [ir.node("Cast", [inits[0]], {"to": ir.DataType.FLOAT})]
        if zero_point:
            inits.append(c("z", z3.astype(np.float32)))
            nodes.append(ir.node("Sub", [nodes[-1].outputs[0], inits[-1]]))
        nodes.append(ir.node("Mul", [nodes[-1].outputs[0], inits[1]]))
    inits.append(c("shape", np.array([rows, cols])))
    nodes.append(ir.node("Reshape", [nodes[-1].outputs[0], inits[-1]]))
    return nodes, inits, nodes[-1].outputs[0], want


def graph_of(inputs: list[ir.Value], outputs: list[ir.Value], nodes: list, inits: list) -> ir.Model:
    """A model of hand-built onnx-ir nodes (opset 21, com.microsoft imported); outputs typed float."""
    for v in outputs:
        v.type = v.type or ir.TensorType(ir.DataType.FLOAT)
    g = ir.Graph(inputs, outputs, nodes=nodes, initializers=inits, opset_imports={"": 21, "com.microsoft": 1},
                 name="hand_built")
    return ir.Model(g, ir_version=10)

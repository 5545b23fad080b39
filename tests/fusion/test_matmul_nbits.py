"""The DequantizeLinear (blocked int4) + MatMul rule on its own, for signed and unsigned weights."""

import ml_dtypes
import numpy as np
import onnx_ir as ir
import pytest

from tests.fusion.graphs import run
from webbuild.fusion import matmul_nbits
from webbuild.fusion.rule_report import Report
from webbuild.fusion.validate import check
from webbuild.graph.ir import census, dead_code_elimination

K, N, BS = 80, 24, 16  # K not a multiple of 32: a partial last block for MatMulNBits to pad


def _graph(signed: bool, zero_point: bool, block: int = BS) -> ir.Model:
    rng = np.random.default_rng(0)
    lo, hi = (-8, 8) if signed else (0, 16)
    dtype = ml_dtypes.int4 if signed else ml_dtypes.uint4
    blocks = -(-K // block)
    x = ir.Value(name="x", shape=ir.Shape([2, K]), type=ir.TensorType(ir.DataType.FLOAT))
    consts = [ir.Value(name="q", const_value=ir.tensor(rng.integers(lo, hi, (K, N)).astype(dtype), name="q")),
              ir.Value(name="s", const_value=ir.tensor(rng.random((blocks, N)).astype(np.float32), name="s"))]
    if zero_point:
        zero_points = rng.integers(lo, hi, (blocks, N)).astype(dtype)
        consts.append(ir.Value(name="z", const_value=ir.tensor(zero_points, name="z")))
    dq = ir.node("DequantizeLinear", consts, {"axis": 0, "block_size": block}, name="dq")
    mm = ir.node("MatMul", [x, dq.outputs[0]], name="mm")
    mm.outputs[0].name = "y"
    mm.outputs[0].type, mm.outputs[0].shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([2, N])
    g = ir.Graph([x], [mm.outputs[0]], nodes=[dq, mm], initializers=consts, opset_imports={"": 21}, name="dq_matmul")
    return ir.Model(g, ir_version=10)


@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("zero_point", [False, True])
def test_packs_to_matmulnbits_with_same_output(signed, zero_point):
    m = _graph(signed, zero_point)
    x = np.random.default_rng(1).standard_normal((2, K)).astype(np.float32)
    want = run(m, {"x": x}, optimize=False)[0]
    assert matmul_nbits.RULE.apply(m, Report()) == 1
    dead_code_elimination(m)
    assert census(m) == {"MatMulNBits": 1}
    node = next(iter(m.graph))
    assert node.attributes["K"].value == K and node.attributes["N"].value == N
    # int4 without zero point is MatMulNBits' default (8 once shifted); every other case carries them
    assert (len(node.inputs) > 3) == (zero_point or not signed)
    check(m)
    np.testing.assert_allclose(run(m, {"x": x})[0], want, rtol=1e-5, atol=1e-5)


def test_odd_block_size_is_left_and_reported():
    m = _graph(False, False, block=5)
    report = Report()
    assert matmul_nbits.RULE.apply(m, report) == 0
    assert census(m) == {"DequantizeLinear": 1, "MatMul": 1} and report.missed


KN, NN = 64, 24  # K a multiple of the block: the 3-D spellings split it into [blocks, block]


def _spelt(dtype: str, zero_point: bool, spelling: str, layout: str) -> ir.Model:
    """x [2, K] @ W [K, N], W dequantized as `spelling` (tests.fusion.graphs.dequantized_weight) and laid
    out as `layout`: "kn" (W itself, blocked along K), "nk" (Transpose of [N, K] blocked along K, the
    WebNN EP's and a tied lm_head's) or "gemm" (Gemm transB on [N, K])."""
    from tests.fusion.graphs import dequantized_weight, graph_of

    rows, cols, axis = (KN, NN, 0) if layout == "kn" else (NN, KN, 1)
    nodes, inits, w, _ = dequantized_weight(rows, cols, axis, BS, dtype, zero_point, spelling)
    x = ir.Value(name="x", shape=ir.Shape([2, KN]), type=ir.TensorType(ir.DataType.FLOAT))
    if layout == "nk":
        nodes.append(ir.node("Transpose", [w], {"perm": [1, 0]}))
        w = nodes[-1].outputs[0]
    nodes.append(ir.node("Gemm", [x, w], {"transB": 1}) if layout == "gemm" else ir.node("MatMul", [x, w]))
    nodes[-1].outputs[0].name, nodes[-1].outputs[0].shape = "y", ir.Shape([2, NN])
    return graph_of([x], [nodes[-1].outputs[0]], nodes, inits)


@pytest.mark.parametrize("dtype", ["int4", "uint4", "int8", "uint8"])
@pytest.mark.parametrize("zero_point", [False, True])
@pytest.mark.parametrize("spelling", ["dq2", "dq3", "cast"])
@pytest.mark.parametrize("layout", ["kn", "nk", "gemm"])
def test_every_spelling_packs_with_same_output(dtype, zero_point, spelling, layout):
    m = _spelt(dtype, zero_point, spelling, layout)
    x = np.random.default_rng(1).standard_normal((2, KN)).astype(np.float32)
    want = run(m, {"x": x}, optimize=False)[0]
    assert matmul_nbits.RULE.apply(m, Report()) == 1
    dead_code_elimination(m)
    assert census(m) == {"MatMulNBits": 1}
    node = next(iter(m.graph))
    attrs = {k: node.attributes[k].value for k in ("K", "N", "bits", "block_size")}
    assert attrs == {"K": KN, "N": NN, "bits": int(dtype[-1]), "block_size": BS}
    # zero points only where they differ from MatMulNBits' default: signed codes without them match it
    assert (len(node.inputs) > 3) == (zero_point or not dtype.startswith("int"))
    check(m)
    np.testing.assert_allclose(run(m, {"x": x})[0], want, rtol=1e-5, atol=1e-5)


def test_weight_blocked_along_n_is_left_and_reported():
    """W [K, N] blocked along N (DequantizeLinear axis 1 feeding MatMul directly): MatMulNBits blocks
    along K, and the rule does not re-quantize."""
    from tests.fusion.graphs import dequantized_weight, graph_of

    nodes, inits, w, _ = dequantized_weight(KN, 32, 1, BS, "uint4", False, "dq2")
    x = ir.Value(name="x", shape=ir.Shape([2, KN]), type=ir.TensorType(ir.DataType.FLOAT))
    nodes.append(ir.node("MatMul", [x, w]))
    m = graph_of([x], [nodes[-1].outputs[0]], nodes, inits)
    report = Report()
    assert matmul_nbits.RULE.apply(m, report) == 0
    assert report.missed[0]["why"] == "the weight is blocked along N, not K (MatMulNBits blocks along K)"
    assert census(m) == {"DequantizeLinear": 1, "MatMul": 1}


def test_gemm_with_bias_is_left_and_reported():
    from tests.fusion.graphs import dequantized_weight, graph_of

    nodes, inits, w, _ = dequantized_weight(NN, KN, 1, BS, "int4", False, "dq2")
    x = ir.Value(name="x", shape=ir.Shape([2, KN]), type=ir.TensorType(ir.DataType.FLOAT))
    bias = ir.Value(name="bias", const_value=ir.tensor(np.ones(NN, np.float32), name="bias"))
    nodes.append(ir.node("Gemm", [x, w, bias], {"transB": 1}))
    m = graph_of([x], [nodes[-1].outputs[0]], nodes, [*inits, bias])
    report = Report()
    assert matmul_nbits.RULE.apply(m, report) == 0
    assert report.missed[0]["why"] == "a Gemm with a bias, transA or alpha/beta != 1"


def _zero_point_spelling(zero: str, sub: str, scales: str, dtype: str, k: int = KN) -> ir.Model:
    """x [2, k] @ W [k, NN], W = (q - z) * s spelt Cast -> Sub -> Mul (`sub` "after" the float Cast, or
    "before" it on int32: Cast(q, int32) - z, then Cast to float), or DequantizeLinear ("dq"). `scales`:
    "block" (3-D codes [blocks, BS, N] with scales [blocks, 1, N], then Reshape) or "column" (2-D codes,
    one scale per column). `zero`: "none", "scalar", "int" (shaped like the scales) or "float" (the same as
    float)."""
    import ml_dtypes

    from tests.fusion.graphs import INT_CODES, graph_of

    bits, signed = INT_CODES[dtype]
    np_type = {"int4": ml_dtypes.int4, "uint4": ml_dtypes.uint4, "int8": np.int8, "uint8": np.uint8}[dtype]
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1)) if signed else (0, 2 ** bits)
    rng = np.random.default_rng(3)
    blocks = k // BS
    q = rng.integers(lo, hi, (k, NN))
    shape3, s_shape = ((blocks, BS, NN), (blocks, 1, NN)) if scales == "block" else ((k, NN), (NN,))
    scale = (rng.random(s_shape) * 0.1 + 0.01).astype(np.float32)
    z = {"none": None, "scalar": np.array(lo + 3), "int": rng.integers(lo, hi, s_shape),
         "float": rng.integers(lo, hi, s_shape).astype(np.float32)}[zero]
    inits = [ir.Value(name="q", const_value=ir.tensor(q.reshape(shape3).astype(np_type), name="q")),
             ir.Value(name="s", const_value=ir.tensor(scale, name="s"))]
    if sub == "dq":
        if z is not None:
            inits.append(ir.Value(name="z", const_value=ir.tensor(z.astype(np_type), name="z")))
        nodes = [ir.node("DequantizeLinear", inits, {"axis": 1})]
    else:
        work = ir.DataType.INT32 if sub == "before" else ir.DataType.FLOAT
        nodes = [ir.node("Cast", [inits[0]], {"to": work})]
        if z is not None:
            zt = z.astype(np.int32) if sub == "before" else z.astype(np.float32)
            inits.append(ir.Value(name="z", const_value=ir.tensor(zt, name="z")))
            nodes.append(ir.node("Sub", [nodes[-1].outputs[0], inits[-1]]))
        if sub == "before":
            nodes.append(ir.node("Cast", [nodes[-1].outputs[0]], {"to": ir.DataType.FLOAT}))
        nodes.append(ir.node("Mul", [inits[1], nodes[-1].outputs[0]]))  # the scale first: either order is read
    if scales == "block":
        inits.append(ir.Value(name="shape", const_value=ir.tensor(np.array([k, NN]), name="shape")))
        nodes.append(ir.node("Reshape", [nodes[-1].outputs[0], inits[-1]]))
    x = ir.Value(name="x", shape=ir.Shape([2, k]), type=ir.TensorType(ir.DataType.FLOAT))
    nodes.append(ir.node("MatMul", [x, nodes[-1].outputs[0]]))
    nodes[-1].outputs[0].name, nodes[-1].outputs[0].shape = "y", ir.Shape([2, NN])
    return graph_of([x], [nodes[-1].outputs[0]], nodes, inits)


ZERO_SPELLINGS = [(zero, sub) for zero in ("none", "scalar", "int", "float") for sub in ("after", "before")
                  if not (zero == "float" and sub == "before")] + [("none", "dq"), ("int", "dq")]


# per-block DequantizeLinear is the 3-D form test_every_spelling_packs_with_same_output covers
SPELLINGS_AND_SCALES = [(zero, sub, scales) for zero, sub in ZERO_SPELLINGS for scales in ("block", "column")
                        if not (sub == "dq" and scales == "block")]


@pytest.mark.parametrize(("zero", "sub", "scales"), SPELLINGS_AND_SCALES)
@pytest.mark.parametrize("dtype", ["int4", "uint8"])
def test_zero_point_spellings_pack_with_same_output(zero, sub, scales, dtype):
    """Scalar, per-block, per-column or absent zero points, integer or float, the Sub before or after the
    Cast; per-column weights (one block of K = 64) cut into MatMulNBits' blocks of 32."""
    m = _zero_point_spelling(zero, sub, scales, dtype)
    x = np.random.default_rng(1).standard_normal((2, KN)).astype(np.float32)
    want = run(m, {"x": x}, optimize=False)[0]
    report = Report()
    assert matmul_nbits.RULE.apply(m, report) == 1, report.missed
    dead_code_elimination(m)
    assert census(m) == {"MatMulNBits": 1}
    node = next(iter(m.graph))
    assert node.attributes["block_size"].value == (BS if scales == "block" else 32)
    check(m)
    np.testing.assert_allclose(run(m, {"x": x})[0], want, rtol=1e-5, atol=1e-5)


def test_per_column_weight_of_odd_k_pads_its_last_block():
    m = _zero_point_spelling("int", "after", "column", "uint8", k=72)
    x = np.random.default_rng(1).standard_normal((2, 72)).astype(np.float32)
    want = run(m, {"x": x}, optimize=False)[0]
    assert matmul_nbits.RULE.apply(m, Report()) == 1
    dead_code_elimination(m)
    np.testing.assert_allclose(run(m, {"x": x})[0], want, rtol=1e-5, atol=1e-5)


def test_zero_points_out_of_the_codes_range_are_refused():
    m = _zero_point_spelling("int", "after", "block", "int4")
    z = m.graph.initializers["z"]
    z.const_value = ir.tensor(np.full(z.const_value.shape.numpy(), 9.0, np.float32), name="z")
    report = Report()
    assert matmul_nbits.RULE.apply(m, report) == 0
    assert report.missed[0]["why"] == "zero points outside the 4-bit codes' range"

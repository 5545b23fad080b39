"""Dequantized table + Gather -> GatherBlockQuantized, for every code type and spelling, tied to an
lm_head or not; the table's bytes are kept, never dequantized."""

import numpy as np
import onnx_ir as ir
import pytest

from tests.fusion.graphs import dequantized_weight, graph_of, run
from webbuild.fusion import gather_block_quantized, matmul_nbits
from webbuild.fusion.fuse_decoder import fuse_decoder
from webbuild.fusion.rule_report import Report
from webbuild.fusion.validate import check
from webbuild.graph.ir import census

V, H, BS = 96, 64, 16
IDS = np.array([[3, 95, 0], [7, 7, 50]])


def _lookup(dtype="uint4", zero_point=False, spelling="dq2", lm_head=None, block=BS, axis=1) -> ir.Model:
    """ids [2, 3] -> rows of the dequantized table [V, H] (output "embeds"); with `lm_head` ("transpose":
    Transpose + MatMul, "gemm": Gemm transB) also x [2, H] -> logits [2, V] on the same dequantized table."""
    nodes, inits, table, _ = dequantized_weight(V, H, axis, block, dtype, zero_point, spelling)
    ids = ir.Value(name="ids", shape=ir.Shape([2, 3]), type=ir.TensorType(ir.DataType.INT64))
    gather = ir.node("Gather", [table, ids], {"axis": 0})
    gather.outputs[0].name, gather.outputs[0].shape = "embeds", ir.Shape([2, 3, H])
    nodes.append(gather)
    inputs, outputs = [ids], [gather.outputs[0]]
    if lm_head:
        x = ir.Value(name="x", shape=ir.Shape([2, H]), type=ir.TensorType(ir.DataType.FLOAT))
        if lm_head == "transpose":
            nodes.append(ir.node("Transpose", [table], {"perm": [1, 0]}))
            nodes.append(ir.node("MatMul", [x, nodes[-1].outputs[0]]))
        else:
            nodes.append(ir.node("Gemm", [x, table], {"transB": 1}))
        nodes[-1].outputs[0].name, nodes[-1].outputs[0].shape = "logits", ir.Shape([2, V])
        inputs.append(x)
        outputs.append(nodes[-1].outputs[0])
    return graph_of(inputs, outputs, nodes, inits)


def _feeds(m: ir.Model) -> dict:
    x = np.random.default_rng(1).standard_normal((2, H)).astype(np.float32)
    return {"ids": IDS, **({"x": x} if len(m.graph.inputs) > 1 else {})}


@pytest.mark.parametrize("dtype", ["int4", "uint4", "int8", "uint8"])
@pytest.mark.parametrize("zero_point", [False, True])
@pytest.mark.parametrize("spelling", ["dq2", "dq3", "cast"])
@pytest.mark.parametrize("lm_head", [None, "transpose", "gemm"])
def test_lookup_fuses_with_same_rows(dtype, zero_point, spelling, lm_head):
    m = _lookup(dtype, zero_point, spelling, lm_head)
    feeds = _feeds(m)
    want = run(m, feeds, optimize=False)
    fused, report = fuse_decoder(m, prune_lm_head_=False, pack_qkv=False)
    assert report["not_fused"] == []
    assert report["fused"] == {"gather_block_quantized": 1, **({"matmul_nbits": 1} if lm_head else {})}
    ops = census(fused)
    assert ops.pop("GatherBlockQuantized") == 1 and ops.pop("MatMulNBits", 0) == (1 if lm_head else 0)
    assert set(ops) <= {"Reshape"}, ops  # the lookup's reshape, and the tied scales' (folded when small)
    lookup = next(n for n in fused.graph if n.op_type == "GatherBlockQuantized")
    assert lookup.attributes["bits"].value == int(dtype[-1])
    if lm_head:  # one copy of the table's bytes serves both
        lm = next(n for n in fused.graph if n.op_type == "MatMulNBits")
        assert lm.inputs[1] is lookup.inputs[0]
        assert (lm.attributes["K"].value, lm.attributes["N"].value) == (H, V)
    # no float table: every float initializer is at most the scales' size
    floats = [v.const_value.size for v in fused.graph.initializers.values() if v.const_value.dtype.is_floating_point()]
    assert max(floats) <= V * H // BS
    check(fused)
    for got, expected in zip(run(fused, feeds), want):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    again, report = fuse_decoder(fused, prune_lm_head_=False, pack_qkv=False)
    assert census(again) == census(fused) and report["fused"] == {}


def test_signed_table_bytes_are_flipped_not_unpacked():
    """int4 codes c become c + 8 in GatherBlockQuantized's uint8 data: the stored byte with each nibble's
    top bit flipped."""
    m = _lookup("int4")
    stored = ir.convenience.get_const_tensor(next(n for n in m.graph if n.op_type == "DequantizeLinear").inputs[0])
    raw = np.frombuffer(stored.tobytes(), np.uint8)
    fused, _ = fuse_decoder(m, prune_lm_head_=False)
    data = next(n for n in fused.graph if n.op_type == "GatherBlockQuantized").inputs[0].const_value.numpy()
    assert data.shape == (V, H // BS, BS // 2)
    np.testing.assert_array_equal(data.reshape(-1), raw ^ 0x88)


@pytest.mark.parametrize(("kwargs", "why"), [
    ({"block": 8}, "block size 8 (GatherBlockQuantized takes powers of 2 >= 16)"),
    ({"axis": 0}, "not rows gathered from a table blocked along its rows' length"),
])
def test_unfit_tables_are_left_and_reported(kwargs, why):
    m = _lookup(**kwargs)
    before = census(m)
    report = Report()
    assert gather_block_quantized.RULE.apply(m, report) == 0
    assert census(m) == before
    assert [miss["why"] for miss in report.missed] == [why]


def test_a_tied_lm_head_blocked_along_n_is_reported():
    """Gather rows of a table blocked along V cannot be looked up blockwise, nor can MatMul(x, table^T)
    take it as MatMulNBits' B: both say so."""
    m = _lookup(axis=0, lm_head="transpose")
    report = Report()
    assert gather_block_quantized.RULE.apply(m, report) + matmul_nbits.RULE.apply(m, report) == 0
    assert [miss["rule"] for miss in report.missed] == ["gather_block_quantized", "matmul_nbits"]
    assert "blocked along N" in report.missed[1]["why"]

"""decompose() undoes the fusion; fusing its output gives back the same graph (census and outputs)."""

import numpy as np
import onnx_ir as ir
import pytest

from webbuild.fusion import parity
from webbuild.fusion.decompose import decompose
from webbuild.fusion.fuse_decoder import fuse_decoder, save
from webbuild.fusion.validate import check_file
from webbuild.graph.ir import census

FUSED_OPS = {"GroupQueryAttention", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization"}


def _round_trip(fused_path, tmp_path, table):
    original = ir.load(fused_path)
    want = census(original)
    flat = ir.load(fused_path)
    decompose(flat)
    assert not FUSED_OPS & set(census(flat)) and census(flat)["Softmax"] >= 2
    flat_path = save(flat, tmp_path / "flat")
    check_file(flat_path)
    near = parity.compare(parity.MergedRunner(fused_path), parity.MergedRunner(flat_path), table)
    assert near["max_rel_err"] < 1e-4 and near["tokens_equal"], near
    n_pos = original.graph.initializers["cos_cache"].const_value.shape[0]
    again, report = fuse_decoder(ir.load(flat_path), max_positions=n_pos)
    assert census(again) == want and report["not_fused"] == []
    back = parity.compare(parity.MergedRunner(fused_path), parity.MergedRunner(save(again, tmp_path / "again")), table)
    assert back["max_rel_err"] < 1e-5 and back["tokens_equal"], back


def test_round_trip_zoo(fused, tmp_path):
    layout, exporter, path, model, report, out = fused
    _round_trip(out, tmp_path, parity.embed_table(path if path.is_dir() else path.parent))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_round_trip_without_qk_norm(zoo, family, tmp_path):
    src = zoo.family(family)
    fused_path = save(fuse_decoder(src)[0], tmp_path / "fused")
    _round_trip(fused_path, tmp_path, parity.embed_table(src.parent))


def test_round_trip_matmulnbits(zoo, tmp_path):
    """MatMulNBits <-> blocked DequantizeLinear + MatMul. onnxruntime turns DQ + MatMul back into
    MatMulNBits at session creation with accuracy_level 4 (int8 activations) unless told otherwise,
    so the numeric check pins both sides to accuracy level 0."""
    src = zoo.quantized()
    fused = fuse_decoder(src)[0]
    for n in fused.graph:
        if n.op_type == "MatMulNBits":
            n.attributes["accuracy_level"] = ir.AttrInt64("accuracy_level", 0)
    fused_path = save(fused, tmp_path / "fused")
    want = census(ir.load(fused_path))
    flat = ir.load(fused_path)
    assert decompose(flat)["MatMulNBits"] == 21
    assert "MatMulNBits" not in census(flat) and census(flat)["DequantizeLinear"] == 21
    assert flat.graph.opset_imports[""] == 21
    flat_path = save(flat, tmp_path / "flat")
    check_file(flat_path)
    table = parity.embed_table(src.parent)
    exact = {"session.qdq_matmulnbits_accuracy_level": "0"}
    near = parity.compare(parity.MergedRunner(fused_path), parity.MergedRunner(flat_path, config=exact), table)
    assert near["max_rel_err"] < 1e-5 and near["tokens_equal"], near
    again, report = fuse_decoder(ir.load(flat_path), max_positions=2048)
    assert census(again) == want and report["not_fused"] == [] and report["fused"]["matmul_nbits"] == 21
    back = parity.compare(parity.MergedRunner(fused_path), parity.MergedRunner(save(again, tmp_path / "again")), table)
    assert back["max_rel_err"] < 1e-6 and back["tokens_equal"], back


def _packed_weights(model: ir.Model) -> list:
    """Each quantized contrib node's attributes and the bytes of its constant inputs (a Reshape of a
    constant, the lookup's scales shared with lm_head, read as its result), in a name-free order."""
    def data(v):
        if v is None:
            return None
        r = v.producer()
        if r is not None and r.op_type == "Reshape" and r.inputs[0].const_value is not None:
            a = r.inputs[0].const_value.numpy().reshape(r.inputs[1].const_value.numpy())
            return (r.inputs[0].const_value.dtype, a.shape, a.tobytes())
        t = ir.convenience.get_const_tensor(v)
        return (t.dtype, tuple(t.shape), t.tobytes()) if t is not None else "input"
    nodes = [n for n in model.graph if n.op_type in ("GatherBlockQuantized", "MatMulNBits")]
    out = [(n.op_type, sorted((k, a.value) for k, a in n.attributes.items()), [data(v) for v in n.inputs])
           for n in nodes]
    return sorted(out, key=repr)


SPELLINGS = {"dq": {"DequantizeLinear", "Gather", "MatMul"}, "cast": {"Cast", "Mul", "Reshape", "Transpose"}}


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("zero_points", [False, True])
@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("weights", ["dq", "cast"])
def test_round_trip_quantized_weights(bits, tied, zero_points, signed, weights):
    """GatherBlockQuantized (tied to lm_head or not) and MatMulNBits -> DequantizeLinear + Gather and the
    weights' spelling (DequantizeLinear + MatMul, or Cast / Sub / Mul) -> back: the same nodes with
    byte-identical weights, and the same outputs on onnxruntime CPU."""
    from tests.fusion.graphs import packed_lookup_graph, run

    original = packed_lookup_graph(bits, tied, zero_points)
    flat = packed_lookup_graph(bits, tied, zero_points)
    assert decompose(flat, weights=weights, signed=signed) == {"GatherBlockQuantized": 1, "MatMulNBits": 2}
    ops = census(flat)
    assert not {"GatherBlockQuantized", "MatMulNBits"} & set(ops) and SPELLINGS[weights] <= set(ops), ops
    # the table's, then one per MatMulNBits in the DequantizeLinear spelling, a tied lm_head reading the table's
    assert ops["DequantizeLinear"] == 1 + (0 if weights == "cast" else 2 - tied)
    ids = {"ids": np.array([[1, 5, 4095], [0, 7, 100]])}
    want = run(original, ids)
    for got in run(flat, ids, optimize=False):  # the decomposed ops as they stand, not re-fused by onnxruntime
        np.testing.assert_allclose(got, want.pop(0), rtol=1e-5, atol=1e-5)
    again, report = fuse_decoder(flat, prune_lm_head_=False, pack_qkv=False)
    assert report["not_fused"] == [] and report["fused"] == {"gather_block_quantized": 1, "matmul_nbits": 2}
    assert census(again) == census(original)
    assert _packed_weights(again) == _packed_weights(original)
    for got, expected in zip(run(again, ids), run(original, ids)):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(("weights", "signed"), [("dq", False), ("cast", True)])
def test_round_trip_shipped_quantized_decoder(zoo, tmp_path, weights, signed):
    """The decoder `webbuild fuse` ships (int4 MatMulNBits at accuracy level 4; the embedding lookup
    reading lm_head's bytes and scales) -> every fused op decomposed, the weights in the WebNN EP's
    spellings -> fused again: the same census, the same nodes with byte-identical weights."""
    from webbuild.pipeline.fuse import run_fuse

    run_fuse(zoo.source("qwen3-asr-split", "torchscript"), tmp_path / "q")
    path = tmp_path / "q" / "decoder.onnx"
    original, flat = ir.load(path), ir.load(path)
    done = decompose(flat, weights=weights, signed=signed)
    assert done["GatherBlockQuantized"] == 1 and done["MatMulNBits"] == census(original)["MatMulNBits"]
    n_pos = original.graph.initializers["cos_cache"].const_value.shape[0]
    again, report = fuse_decoder(flat, max_positions=n_pos)
    # the one difference allowed: this small table's scales Reshape is folded by the closing cleanup
    # (a real table's is over the folding limit), so the lookup reads a constant of the same bytes
    want = census(original)
    want["Reshape"] += _scales_reshapes(again) - _scales_reshapes(original)
    assert report["not_fused"] == [] and census(again) == want
    assert _packed_weights(again) == _packed_weights(original)


def _scales_reshapes(model: ir.Model) -> int:
    return sum(n.inputs[2].producer() is not None for n in model.graph if n.op_type == "GatherBlockQuantized")

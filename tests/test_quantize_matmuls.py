"""MatMul -> MatMulNBits: packed shapes, attributes, error bounds against a numpy dequantization."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnxruntime.quantization.matmul_nbits_quantizer import HQQWeightOnlyQuantConfig, MatMulNBitsQuantizer

from tests.quantize_graphs import attrs, initializer, matmul_model, model, nbits_weight, nodes_of, run
from webbuild.config import Quantize
from webbuild.quantize.lazy import load_lazily
from webbuild.quantize.quantize_matmuls import quantize_matmuls

K, N = 128, 96
RNG = np.random.default_rng(0)
W = RNG.standard_normal((K, N)).astype(np.float32)
X = RNG.standard_normal((1, 3, K)).astype(np.float32)


def _block_scales(w: np.ndarray, block: int) -> np.ndarray:
    """One quantization step of each element's block (symmetric: absmax / 8 for int4)."""
    absmax = np.abs(w).reshape(-1, block, w.shape[1]).max(axis=1)
    return np.repeat(absmax, block, axis=0)


@pytest.mark.parametrize("bits,levels", [(4, 8), (8, 128)])
def test_rtn_packs_symmetric_blocks_within_one_step(bits, levels):
    m = quantize_matmuls(matmul_model(W, ("proj/MatMul",)), Quantize(bits=bits))
    (node,) = nodes_of(m, "MatMulNBits")
    assert not nodes_of(m, "MatMul")
    assert node.domain == "com.microsoft"
    assert attrs(node) == {"K": K, "N": N, "bits": bits, "block_size": 32, "accuracy_level": 4}
    assert len(node.input) == 3  # symmetric: no zero points
    packed, scales = initializer(m, node.input[1]), initializer(m, node.input[2])
    assert packed.dtype == np.uint8 and packed.shape == (N, K // 32, 32 * bits // 8)
    assert scales.shape == (N, K // 32)
    w = nbits_weight(m, node)
    err = np.abs(w - W)
    step = _block_scales(W, 32) / levels
    # rounding: half a step; the one code past the signed max (-absmax -> +8, clipped to 7): one step
    assert np.all(err <= step + 1e-6)
    assert np.mean(err <= 0.5 * step + 1e-6) > 0.98
    assert err.max() > 0  # it did quantize
    # accuracy_level 4 quantizes the activations to int8 per block: close, not exact
    y = X @ w
    assert np.abs(run(m, {"x": X})[0] - y).max() < 0.02 * np.abs(y).max()
    # with float activations onnxruntime's kernel multiplies by exactly the weight numpy unpacked
    _drop_attr(node, "accuracy_level")
    np.testing.assert_allclose(run(m, {"x": X})[0], y, rtol=1e-4, atol=1e-4)


def _drop_attr(node, name: str) -> None:
    keep = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(keep)


def test_int8_is_tighter_than_int4():
    e4 = np.abs(nbits_weight(m4 := quantize_matmuls(matmul_model(W), Quantize(bits=4)),
                             nodes_of(m4, "MatMulNBits")[0]) - W).max()
    e8 = np.abs(nbits_weight(m8 := quantize_matmuls(matmul_model(W), Quantize(bits=8)),
                             nodes_of(m8, "MatMulNBits")[0]) - W).max()
    assert e8 < e4 / 8


def test_exclusions_by_node_name_pattern_stay_float():
    w = RNG.standard_normal((K, K)).astype(np.float32)
    names = ("/layers.0/q_proj/MatMul", "/layers.0/mlp/down_proj/MatMul", "/lm_head/MatMul")
    m = quantize_matmuls(matmul_model(w, names), Quantize(exclude=("*down_proj*", "/lm_head/*")))
    assert [n.name for n in nodes_of(m, "MatMul")] == list(names[1:])
    assert [n.name for n in nodes_of(m, "MatMulNBits")] == ["/layers.0/q_proj/MatMul_Q4"]


def test_method_none_leaves_the_graph_alone():
    m = quantize_matmuls(matmul_model(W), Quantize(method="none"))
    assert len(nodes_of(m, "MatMul")) == 1 and not nodes_of(m, "MatMulNBits")


def test_gemm_with_transposed_weight_and_bias_is_quantized():
    wt = W.T.copy()  # Linear layout [N, K], transB=1
    bias = RNG.standard_normal(N).astype(np.float32)
    g = model([helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc/Gemm", transB=1)],
              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", K])],
              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], {"w": wt, "b": bias})
    m = quantize_matmuls(g, Quantize())
    assert [n.op_type for n in m.graph.node] == ["MatMulNBits", "Add"]
    _drop_attr(m.graph.node[0], "accuracy_level")
    x = X[0]
    y = run(m, {"x": x})[0]
    np.testing.assert_allclose(y, x @ nbits_weight(m, m.graph.node[0]) + bias, rtol=1e-4, atol=1e-4)
    assert np.abs(y - (x @ W + bias)).max() < 0.1 * np.abs(x @ W).max()


@pytest.mark.torch  # onnxruntime's HQQ quantizer computes with torch
def test_hqq_zero_points_rounded_to_uint8_move_weights_by_at_most_half_a_step():
    w = W[:64, :32].copy()
    x = X[..., :64]
    raw = matmul_model(w)
    q = MatMulNBitsQuantizer(raw, algo_config=HQQWeightOnlyQuantConfig(block_size=32, bits=4))
    q.process()
    float_zp = q.model.model
    (ref_node,) = nodes_of(float_zp, "MatMulNBits")
    assert initializer(float_zp, ref_node.input[3]).dtype.kind == "f"
    m = quantize_matmuls(matmul_model(w), Quantize(method="hqq"))
    (node,) = nodes_of(m, "MatMulNBits")
    zp = initializer(m, node.input[3])
    assert zp.dtype == np.uint8 and zp.shape == (32, 1)  # 2 blocks of 4-bit zero points in one byte
    assert attrs(node)["accuracy_level"] == 4
    _drop_attr(node, "accuracy_level")
    _drop_attr(ref_node, "accuracy_level")
    w_hqq, w_u8 = nbits_weight(float_zp, ref_node), nbits_weight(m, node)
    np.testing.assert_allclose(run(float_zp, {"x": x})[0], x @ w_hqq, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(run(m, {"x": x})[0], x @ w_u8, rtol=1e-4, atol=1e-4)
    half_step = 0.5 * np.repeat(initializer(m, node.input[2]).reshape(32, 2), 32, axis=1).T + 1e-6
    assert np.all(np.abs(w_u8 - w_hqq) <= half_step)
    assert np.abs(w_u8 - w).max() <= np.abs(w_hqq - w).max() + half_step.max()


@pytest.mark.parametrize("method", ["rtn", "hqq"])
def test_weights_left_on_disk_by_the_lazy_loader_are_quantized_by_either_method(tmp_path, method):
    """A build's decoder is loaded with its MatMul weights left in the data file (webbuild.quantize.lazy); HQQ reads
    them with onnx's own reader, which refuses the absolute locations they then have."""
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    onnx.save(matmul_model(w), tmp_path / "m.onnx", save_as_external_data=True, location="m.onnx.data",
              size_threshold=0)
    lazy = quantize_matmuls(load_lazily(tmp_path / "m.onnx"), Quantize(method=method))
    in_memory = quantize_matmuls(matmul_model(w), Quantize(method=method))
    assert len(nodes_of(lazy, "MatMulNBits")) == 1 and not nodes_of(lazy, "MatMul")
    x = np.random.default_rng(1).standard_normal((1, 2, 64)).astype(np.float32)
    np.testing.assert_array_equal(run(lazy, {"x": x})[0], run(in_memory, {"x": x})[0])

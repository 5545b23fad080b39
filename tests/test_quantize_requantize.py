"""MatMulNBits from a block-64 source -> block 32: dequantize (numpy) then onnxruntime's quantizer."""

from __future__ import annotations

import numpy as np
from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

from tests.quantize_graphs import attrs, initializer, matmul_model, nbits_weight, nodes_of, run
from webbuild.config import Quantize
from webbuild.quantize.quantize_matmuls import quantize_matmuls
from webbuild.quantize.requantize import requantize

K, N = 256, 64
RNG = np.random.default_rng(1)
W = RNG.standard_normal((K, N)).astype(np.float32)
X = RNG.standard_normal((1, 2, K)).astype(np.float32)


def _source(symmetric: bool):
    cfg = DefaultWeightOnlyQuantConfig(block_size=64, is_symmetric=symmetric, bits=4)
    q = MatMulNBitsQuantizer(matmul_model(W), algo_config=cfg)
    q.process()
    return q.model.model


def _check_block32(m, source_weight):
    (node,) = nodes_of(m, "MatMulNBits")
    assert attrs(node) == {"K": K, "N": N, "bits": 4, "block_size": 32, "accuracy_level": 4}
    assert len(node.input) == 3
    assert initializer(m, node.input[1]).shape == (N, K // 32, 16)
    assert initializer(m, node.input[2]).shape == (N, K // 32)
    w32 = nbits_weight(m, node)
    step = np.repeat(np.abs(initializer(m, node.input[2])), 32, axis=1).T
    # a second rounding of the block-64 weight: within one block-32 step of it
    assert np.all(np.abs(w32 - source_weight) <= step + 1e-6)
    return w32


def test_symmetric_block64_becomes_block32():
    src = _source(symmetric=True)
    w64 = nbits_weight(src, nodes_of(src, "MatMulNBits")[0])
    assert requantize(src, Quantize()) == ["proj/MatMul_Q4"]
    w32 = _check_block32(src, w64)
    # requantizing a dequantized weight is what quantizing that float weight directly gives
    direct = quantize_matmuls(matmul_model(w64), Quantize())
    np.testing.assert_array_equal(w32, nbits_weight(direct, nodes_of(direct, "MatMulNBits")[0]))
    # and still close to the original float weight: within the block-64 step plus a block-32 step
    assert np.abs(w32 - W).max() < 2 * np.abs(W).max() / 8
    assert len(src.graph.initializer) == 2  # the block-64 tensors are gone


def test_asymmetric_source_loses_its_zero_points():
    src = _source(symmetric=False)
    (node,) = nodes_of(src, "MatMulNBits")
    assert len(node.input) == 4
    w64 = nbits_weight(src, node)
    requantize(src, Quantize())
    _check_block32(src, w64)
    y, ref = run(src, {"x": X})[0], X @ W
    # two int4 roundings of a Gaussian weight: ~10% relative rms output error
    assert np.sqrt(np.mean((y - ref) ** 2) / np.mean(ref ** 2)) < 0.2


def test_matching_block_size_is_left_alone():
    m = quantize_matmuls(matmul_model(W), Quantize())
    before = initializer(m, nodes_of(m, "MatMulNBits")[0].input[1]).copy()
    assert requantize(m, Quantize()) == []
    np.testing.assert_array_equal(initializer(m, nodes_of(m, "MatMulNBits")[0].input[1]), before)

"""fp16 variant: fp16 I/O, and the parts that overflow or lose positions in fp16 kept in fp32."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnxruntime.transformers.float16 import convert_float_to_float16

from tests.quantize_graphs import initializer, model, nodes_of, run
from webbuild.config import Quantize
from webbuild.quantize.precision import to_fp16
from webbuild.quantize.quantize_matmuls import quantize_matmuls

H = 64


def _rms_norm_then_rotary():
    """Decomposed RMSNorm (as torchscript exports it) and cos(position * inv_freq), both as outputs."""
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1], keepdims=1),
        helper.make_node("Add", ["var", "eps"], ["var_eps"]),
        helper.make_node("Sqrt", ["var_eps"], ["std"]),
        helper.make_node("Div", ["one", "std"], ["inv"]),
        helper.make_node("Mul", ["x", "inv"], ["normed"]),
        helper.make_node("Mul", ["normed", "gamma"], ["y"]),
        helper.make_node("Cast", ["pos"], ["pos_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["pos_f", "inv_freq"], ["angle"]),
        helper.make_node("Cos", ["angle"], ["cos"]),
    ]
    consts = {"two": np.array(2.0, np.float32), "eps": np.array(1e-6, np.float32), "one": np.array(1.0, np.float32),
              "gamma": np.ones(H, np.float32), "inv_freq": np.array([1.0, 0.1], np.float32)}
    return model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["s", H]),
                         helper.make_tensor_value_info("pos", TensorProto.INT64, ["s", 1])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                   helper.make_tensor_value_info("cos", TensorProto.FLOAT, None)], consts)


def test_rms_statistics_and_rotary_angles_survive_fp16():
    x = (np.random.default_rng(3).standard_normal((2, H)) * 1000).astype(np.float32)  # x^2 > 65504
    pos = np.array([[3001], [40000]], np.int64)  # not integers in fp16
    y32, cos32 = run(_rms_norm_then_rotary(), {"x": x, "pos": pos})
    ours = to_fp16(_rms_norm_then_rotary())
    assert ours.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    y16, cos16 = run(ours, {"x": x.astype(np.float16), "pos": pos})
    assert y16.dtype == np.float16
    np.testing.assert_allclose(y16.astype(np.float32), y32, atol=0.01, rtol=0.01)
    np.testing.assert_allclose(cos16.astype(np.float32), cos32, atol=2e-3)
    # the statistics chain reads fp32 values end to end (no fp16 round trip between its nodes);
    # the CPU EP would hide an fp16 chain by computing Pow/ReduceMean in fp32 itself, WebGPU would not
    by_out = {o: n for n in ours.graph.node for o in n.output}
    for op, prev in (("ReduceMean", "Pow"), ("Add", "ReduceMean"), ("Sqrt", "Add"), ("Div", "Sqrt")):
        (node,) = nodes_of(ours, op)
        assert by_out[node.input[0] if op != "Div" else node.input[1]].op_type == prev
    # the plain conversion loses the positions: what the block list is for
    naive = convert_float_to_float16(_rms_norm_then_rotary())
    _, cos_bad = run(naive, {"x": x.astype(np.float16), "pos": pos})
    assert np.abs(cos_bad.astype(np.float32) - cos32).max() > 0.05


def test_matmulnbits_scales_become_fp16():
    w = np.random.default_rng(4).standard_normal((H, 32)).astype(np.float32)
    g = model([helper.make_node("MatMul", ["x", "w"], ["y"], name="p/MatMul")],
              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["s", H])],
              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], {"w": w})
    m = to_fp16(quantize_matmuls(g, Quantize()))
    (node,) = nodes_of(m, "MatMulNBits")
    assert initializer(m, node.input[2]).dtype == np.float16
    assert not nodes_of(m, "Cast")  # fp16 end to end: no casts around the MatMulNBits
    x = np.random.default_rng(5).standard_normal((3, H)).astype(np.float32)
    y32 = run(quantize_matmuls(onnx.load_from_string(g.SerializeToString()), Quantize()), {"x": x})[0]
    assert np.abs(run(m, {"x": x.astype(np.float16)})[0] - y32).max() < 0.02 * np.abs(y32).max()

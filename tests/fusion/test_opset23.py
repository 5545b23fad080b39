"""opset 23's standard ops: RMSNormalization becomes SimplifiedLayerNormalization with the same output; an
Attention (or RotaryEmbedding) left in a decoder fails --strict, naming where (they are not what
onnxruntime-web's WebGPU EP runs fused), where before a graph with nothing decomposed passed it."""

import numpy as np
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from tests.fusion.graphs import run
from webbuild.fusion.fuse_decoder import fuse_decoder
from webbuild.fusion.rule_report import strict_failures, summary
from webbuild.graph.ir import census

H = 48  # not a power of two


def _graph(attention: bool) -> ir.Model:
    w = np.random.default_rng(0).standard_normal(H).astype(np.float32)
    nodes = [helper.make_node("RMSNormalization", ["x", "w"], ["n"], name="layers.0/input_norm", epsilon=1e-5)]
    if attention:  # standard Attention over the normed input as Q, K and V ([B, S, heads*hd], 3 heads)
        nodes.append(helper.make_node("Attention", ["n", "n", "n"], ["y"], name="layers.0/attn", q_num_heads=3,
                                      kv_num_heads=3, is_causal=1))
    else:
        nodes.append(helper.make_node("Identity", ["n"], ["y"]))
    g = helper.make_graph(nodes, "opset23", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, H])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, H])],
                          [numpy_helper.from_array(w, "w")])
    return ir.from_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)], ir_version=10))


def test_rms_normalization_becomes_simplified_layer_norm_with_the_same_output():
    x = np.random.default_rng(1).standard_normal((1, 5, H)).astype(np.float32)
    want = run(_graph(False), {"x": x})[0]
    model, report = fuse_decoder(_graph(False), prune_lm_head_=False)
    assert census(model) == {"SimplifiedLayerNormalization": 1} and report["fused"] == {"rms_normalization": 1}
    np.testing.assert_allclose(run(model, {"x": x})[0], want, rtol=1e-5, atol=1e-5)


def test_a_standard_attention_left_fails_strict_naming_it():
    _, report = fuse_decoder(_graph(True), prune_lm_head_=False)
    graphs = {"decoder": {"not_fused": report["not_fused"], "ops": report["ops_after"],
                          "left_over": report["left_over"]}}
    assert strict_failures(graphs) == ["decoder: 1 attention pattern not fused"]
    assert "    at layers.0/attn" in summary(graphs)


def test_webbuild_fuse_strict_exits_1_on_a_standard_attention_left(tmp_path):
    """The command itself: a graph holding only standard ops used to pass --strict with nothing fused."""
    import onnx
    from click.testing import CliRunner

    from webbuild.cli import main

    src = tmp_path / "src" / "decoder_model_merged.onnx"
    src.parent.mkdir()
    onnx.save(ir.to_proto(_graph(True)), src)
    result = CliRunner().invoke(main, ["fuse", str(src), "-o", str(tmp_path / "out"), "--no-quantize", "--strict"])
    assert result.exit_code == 1, result.output
    assert "decoder: 1 attention pattern not fused (--strict" in result.output
    assert "  decoder: 1 Attention left (attention not fused)" in result.output.splitlines()

import json

import numpy as np
import onnx_ir as ir
import pytest

from tests.fusion.partial import partly_fused
from webbuild.fusion import gqa, rms_norm, rope, skip_rms_norm
from webbuild.fusion.rule_report import Report
from webbuild.fusion.validate import check
from webbuild.graph.ir import census


def _gqa_fused(path, max_pos=2048):
    return partly_fused(path, [rms_norm.RULE.apply, skip_rms_norm.RULE.apply, gqa.rule(max_pos).apply])


def test_one_gqa_per_layer_and_no_softmax(source):
    layout, _, path = source
    m, report = _gqa_fused(path)
    ops = census(m)
    assert ops["GroupQueryAttention"] == 4 and "Softmax" not in ops
    assert not {"Cos", "Sin", "Neg", "Expand"} & set(ops)  # RoPE and repeat_kv are gone
    node = next(n for n in m.graph if n.op_type == "GroupQueryAttention")
    a = {k: v.value for k, v in node.attributes.items()}
    assert (a["num_heads"], a["kv_num_heads"], a["do_rotary"], a["rotary_interleaved"]) == (4, 2, 1, 0)
    assert a["scale"] == pytest.approx(64 ** -0.5)
    assert node.domain == "com.microsoft"
    assert not report.missed
    check(m)


def test_rope_caches_match_rope_theta(source):
    """The caches come from the graph's inv_freq; compare with config.json's rope_theta."""
    layout, _, path = source
    m, _ = _gqa_fused(path, max_pos=2048)
    cfg = json.loads(((path if path.is_dir() else path.parent) / "config.json").read_text())["decoder"]
    hd, theta = cfg["head_dim"], cfg["rope_theta"]
    inv = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    pos = np.arange(2048)[:, None]
    cos = m.graph.initializers["cos_cache"].const_value.numpy()
    sin = m.graph.initializers["sin_cache"].const_value.numpy()
    assert cos.shape == sin.shape == (2048, hd // 2)
    np.testing.assert_allclose(cos, np.cos(pos * inv), atol=2e-3)  # fp32 angles at large positions
    np.testing.assert_allclose(sin[:64], np.sin(pos[:64] * inv), atol=1e-5)


def test_qk_norm_kept_on_head_axis(source):
    _, _, path = source
    m, _ = _gqa_fused(path)
    node = next(n for n in m.graph if n.op_type == "GroupQueryAttention")
    for slot in (0, 1):
        flat = node.inputs[slot].producer()
        norm = flat.inputs[0].producer()
        assert flat.op_type == "Reshape" and norm.op_type == "SimplifiedLayerNormalization"
        assert norm.inputs[1].const_value.numpy().shape == (64,)


def test_softmax_outside_attention_is_left_and_reported():
    x = ir.Value(name="x", shape=ir.Shape([2, 5]), type=ir.TensorType(ir.DataType.FLOAT))
    sm = ir.node("Softmax", [x], {"axis": -1}, name="plain_softmax")
    sm.outputs[0].name = "y"
    g = ir.Graph([x], [sm.outputs[0]], nodes=[sm], opset_imports={"": 18})
    m = ir.Model(g, ir_version=9)
    report = Report()
    assert gqa.rule(16).apply(m, report) == 0
    assert census(m) == {"Softmax": 1}
    assert report.missed[0]["at"] == "plain_softmax"


def test_rope_caches_reject_interleaved_frequencies():
    # Concat(f, f) is what rotate_half needs; a different second half means another rotary layout
    f = ir.Value(name="f", type=ir.TensorType(ir.DataType.FLOAT))
    g_ = ir.Value(name="g", type=ir.TensorType(ir.DataType.FLOAT))
    cat = ir.node("Concat", [f, g_], {"axis": -1})
    cos = ir.node("Cos", [cat.outputs[0]])
    why = rope.caches(cos.outputs[0], cos.outputs[0], 64, 8)
    assert isinstance(why, str) and "interleaved" in why

"""The step form's two attentions (webbuild.forms.step, model.yaml fusion.step_attention) on a small hand-built
decoder with GroupQueryAttention (rotary embedding, q and k head norms, 4 query heads over 2 key/value heads): decoded
on onnxruntime CPU as runtime/capture.js drives it (a static cache of T positions fed back, the mask's ones up to the
step, each next_token the next input), `direct` gives `gqa`'s tokens, margins and cache, with no GroupQueryAttention
left and the cache written by ScatterND."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from webbuild.forms.form import Report
from webbuild.forms.step import STEP, step_form
from webbuild.site.contract import IO

VOCAB, HIDDEN, HEADS, KV, HD, T, MAX_POS = 50, 64, 4, 2, 16, 12, 64


def decoder(path, norms_in_gqa: bool) -> None:
    """input_ids -> embedding -> q, k, v -> GroupQueryAttention (over the static cache) -> o -> logits; q's and k's
    head norms GroupQueryAttention's inputs (the build's fused form, which only the WebGPU and CUDA EPs run) or
    SimplifiedLayerNormalization over [1, 1, heads, hd] before it (onnxruntime CPU runs that)."""
    rng = np.random.default_rng(3)
    w = lambda *dims: numpy_helper.from_array(rng.normal(0, 0.5, dims).astype(np.float32))  # noqa: E731
    inits = {"embed": w(VOCAB, HIDDEN), "wq": w(HIDDEN, HEADS * HD), "wk": w(HIDDEN, KV * HD),
             "wv": w(HIDDEN, KV * HD), "wo": w(HEADS * HD, HIDDEN), "head": w(HIDDEN, VOCAB)}
    angles = np.arange(MAX_POS)[:, None] / 10000 ** (np.arange(HD // 2) / (HD // 2))
    inits |= {"cos": numpy_helper.from_array(np.cos(angles).astype(np.float32)),
              "sin": numpy_helper.from_array(np.sin(angles).astype(np.float32)),
              "q_norm": numpy_helper.from_array(rng.uniform(0.5, 1.5, HD).astype(np.float32)),
              "k_norm": numpy_helper.from_array(rng.uniform(0.5, 1.5, HD).astype(np.float32))}
    for name, t in inits.items():
        t.name = name
    past, present = [IO.past(0, "key"), IO.past(0, "value")], [IO.present(0, "key"), IO.present(0, "value")]
    nodes = [helper.make_node("Gather", ["embed", IO.input_ids], ["x"]),
             *(helper.make_node("MatMul", ["x", f"w{p}"], [f"{p}_proj" if p != "v" else p]) for p in "qkv")]
    if norms_in_gqa:
        nodes += [helper.make_node("Identity", [f"{p}_proj"], [p]) for p in "qk"]
        norm_inputs = ["q_norm", "k_norm"]
    else:
        for p in "qk":
            nodes += [helper.make_node("Reshape", [f"{p}_proj", f"heads_{p}"], [f"{p}_heads"]),
                      helper.make_node("SimplifiedLayerNormalization", [f"{p}_heads", f"{p}_norm"], [f"{p}_normed"],
                                       axis=-1, epsilon=1e-6),
                      helper.make_node("Reshape", [f"{p}_normed", "flat"], [p])]
        norm_inputs = []
    nodes += [
             helper.make_node("Cast", [IO.attention_mask], ["mask32"], to=TensorProto.INT32),
             helper.make_node("ReduceSum", ["mask32", "axis1"], ["count"], keepdims=0),
             helper.make_node("Sub", ["count", "one"], ["seqlens"]),
             helper.make_node("ReduceMax", ["count"], ["total"], keepdims=0),
             helper.make_node("GroupQueryAttention", ["q", "k", "v", *past, "seqlens", "total", "cos", "sin",
                                                      *([""] * 5 + norm_inputs if norm_inputs else [])],
                              ["attn", *present], domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV,
                              do_rotary=1, rotary_interleaved=0, **({"qk_norm_epsilon": 1e-6} if norm_inputs else {})),
             helper.make_node("MatMul", ["attn", "wo"], ["o"]),
             helper.make_node("MatMul", ["o", "head"], [IO.logits])]
    consts = [numpy_helper.from_array(np.array([1], np.int64), "axis1"),
              numpy_helper.from_array(np.array([1], np.int32), "one"),
              numpy_helper.from_array(np.array([1, 1, HEADS, HD], np.int64), "heads_q"),
              numpy_helper.from_array(np.array([1, 1, KV, HD], np.int64), "heads_k"),
              numpy_helper.from_array(np.array([1, 1, -1], np.int64), "flat")]
    f = TensorProto.FLOAT
    cache = ["batch_size", KV, "past_sequence_length", HD]
    graph = helper.make_graph(
        nodes, "decoder",
        [helper.make_tensor_value_info(IO.input_ids, TensorProto.INT64, ["batch_size", "sequence_length"]),
         helper.make_tensor_value_info(IO.attention_mask, TensorProto.INT64, ["batch_size", "total_sequence_length"]),
         *(helper.make_tensor_value_info(n, f, cache) for n in past)],
        [helper.make_tensor_value_info(IO.logits, f, ["batch_size", "sequence_length", VOCAB]),
         *(helper.make_tensor_value_info(n, f, cache) for n in present)],
        [*inits.values(), *consts])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    onnx.save(model, str(path))


def decode(path, steps: int) -> tuple[list[int], list[float], np.ndarray]:
    """`steps` greedy steps from token 1 over an empty static cache of T positions: tokens, margins, final key cache."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    keys, values = (np.zeros((1, KV, T, HD), np.float32) for _ in range(2))
    token, mask, tokens, margins = np.array([[1]], np.int32), np.zeros((1, T), np.int64), [], []
    for i in range(steps):
        mask[0, i] = 1
        token, margin, keys, values = session.run(
            [IO.next_token, IO.margin, IO.present(0, "key"), IO.present(0, "value")],
            {IO.input_ids: token, IO.attention_mask: mask, IO.past(0, "key"): keys, IO.past(0, "value"): values})
        tokens.append(int(token[0, 0]))
        margins.append(float(margin[0, 0]))
    return tokens, margins, keys


@pytest.fixture(scope="module")
def forms(tmp_path_factory):
    folder = tmp_path_factory.mktemp("step_attention")
    made = {}
    # gqa: the reference onnxruntime CPU runs; direct from the fused norms (scale folded into q's) and from none
    for form, attention, norms_in_gqa in (("gqa", "gqa", False), ("direct", "direct", True),
                                          ("direct_plain", "direct", False)):
        (folder / form).mkdir()
        decoder(folder / form / "decoder.onnx", norms_in_gqa)
        report = Report()
        made[form] = folder / form / report.make(STEP, "fp32/decoder", folder / form, "decoder.onnx", None, attention)
        assert report.missed == []
    return made


@pytest.mark.parametrize("form", ["direct", "direct_plain"])
def test_direct_attention_decodes_as_group_query_attention(forms, form):
    gqa, direct = decode(forms["gqa"], T), decode(forms[form], T)
    assert gqa[0] == direct[0] and len(set(gqa[0])) > 3  # the same tokens, and not one token over and over
    np.testing.assert_allclose(direct[1], gqa[1], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(direct[2], gqa[2], rtol=1e-5, atol=1e-5)  # every position of the cache written alike


def test_direct_attention_has_no_group_query_attention_and_scatters_the_cache(forms):
    ops = Counter(n.op_type for n in onnx.load(str(forms["direct"])).graph.node)
    assert ops["GroupQueryAttention"] == 0
    assert ops["ScatterND"] == 2 and ops["RotaryEmbedding"] == 2 and ops["SimplifiedLayerNormalization"] == 2
    outputs = [o.name for o in onnx.load(str(forms["direct"])).graph.output]
    assert outputs == [IO.present(0, "key"), IO.present(0, "value"), IO.next_token, IO.margin]


def test_an_unknown_attention_is_refused(tmp_path):
    decoder(tmp_path / "decoder.onnx", True)
    with pytest.raises(ValueError, match="attention must be one of direct, gqa, not 'flash'"):
        step_form(ir.load(tmp_path / "decoder.onnx"), "flash")

"""The GQA rule on one hand-made attention varied along each axis exporters differ on
(tests/fusion/attention_graph.py): every spelling fuses to one GroupQueryAttention that computes what
the source does over a prefill and decode steps with the KV cache; the spellings GQA cannot compute
(no causal mask, a strided mask, an added bias, KV heads tiled in the wrong order) stay as they are (a static
KV cache written by ScatterND: test_static_cache.py); a RoPE whose caches GQA cannot rebuild (interleaved pairs with
tables for rotate_half) stays as the source computes it, GQA taking Q and K rotated,
with the reason in the report. Node and value names are random, different for each seed."""

import numpy as np
import pytest

from tests.fusion.attention_graph import AXES, KEPT_ROPE, MAX_POS, NEGATIVE, WINDOW, attention_graph, run
from webbuild.fusion.fuse_decoder import fuse_decoder
from webbuild.graph.ir import census

VARIANTS = [{}] + [{axis: s} for axis, spellings in AXES.items() for s in spellings[1:]]


def _fuse(**axes):
    return fuse_decoder(attention_graph(seed=7, **axes), max_positions=MAX_POS, prune_lm_head_=False)


@pytest.mark.parametrize("axes", VARIANTS, ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items()) or "default")
def test_every_spelling_fuses_and_computes_the_same(axes):
    model, report = _fuse(**axes)
    ops = census(model)
    assert ops.get("GroupQueryAttention") == 1 and "Softmax" not in ops, report["not_fused"]
    gqa = next(n for n in model.graph if n.op_type == "GroupQueryAttention")
    assert gqa.attributes["rotary_interleaved"].value == (axes.get("rope") == "interleaved")
    window = gqa.attributes.get("local_window_size")
    assert (window.value if window else None) == (WINDOW if axes.get("mask") == "sliding_window" else None)
    want, got = run(attention_graph(seed=7, **axes)), run(model)
    for step_want, step_got in zip(want, got):  # out, present key, present value at each step
        for a, b in zip(step_want, step_got):
            np.testing.assert_allclose(b, a, atol=2e-5, rtol=1e-4)


def test_all_axes_at_once():
    """The last spelling of every axis together (Einsum with K untransposed, the scale on Q before RoPE, ...)."""
    axes = {axis: spellings[-1] for axis, spellings in AXES.items()}
    model, report = _fuse(**axes)
    assert census(model).get("GroupQueryAttention") == 1, report["not_fused"]
    for step_want, step_got in zip(run(attention_graph(seed=7, **axes)), run(model)):
        for a, b in zip(step_want, step_got):
            np.testing.assert_allclose(b, a, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("axis,spelling", [(a, s) for a, ss in NEGATIVE.items() for s in ss])
def test_attention_gqa_cannot_compute_is_left_with_its_reason(axis, spelling):
    model, report = _fuse(**{axis: spelling})
    ops = census(model)
    assert "GroupQueryAttention" not in ops and ops["Softmax"] == 1
    why = [m["why"] for m in report["not_fused"] if m["rule"] == "gqa"]
    expected = {"none": "not causal", "strided": "not causal", "bias": "bias", "tile_whole": "tiled"}[spelling]
    assert len(why) == 1 and expected in why[0], why


def test_names_play_no_part():
    """Two seeds name every node and inner value differently; the fused graphs have the same ops and
    the same GQA attributes."""
    fused = [fuse_decoder(attention_graph(seed=s), max_positions=MAX_POS, prune_lm_head_=False)[0] for s in (1, 2)]
    names = [{n.name for n in attention_graph(seed=s).graph} for s in (1, 2)]
    assert not names[0] & names[1]
    assert census(fused[0]) == census(fused[1])
    attrs = [{k: v.value for k, v in next(n for n in m.graph if n.op_type == "GroupQueryAttention").attributes.items()}
             for m in fused]
    assert attrs[0] == attrs[1]


def test_rope_gqa_cannot_rebuild_stays_and_gqa_takes_q_and_k_rotated():
    model, report = _fuse(**KEPT_ROPE)
    ops = census(model)
    assert ops.get("GroupQueryAttention") == 1 and "Softmax" not in ops
    assert {m["rule"] for m in report["not_fused"]} == {"packed_qkv"}  # Q and K are no projections to pack
    gqa = next(n for n in model.graph if n.op_type == "GroupQueryAttention")
    assert gqa.attributes["do_rotary"].value == 0 and len(gqa.inputs) == 7  # no caches
    assert any("RoPE left as the source computes it" in note and "differ from the source" in note
               for note in report["notes"])
    for step_want, step_got in zip(run(attention_graph(seed=7, **KEPT_ROPE)), run(model)):
        for a, b in zip(step_want, step_got):
            np.testing.assert_allclose(b, a, atol=2e-5, rtol=1e-4)

"""A static KV cache written in place by ScatterND (the WebNN execution provider's form,
tests/fusion/static_cache_graph.py) becomes one GroupQueryAttention per layer over a shared past/present buffer:
odd shapes and every spelling of the write, the written length and the mask; same logits on onnxruntime CPU as
the source on the same static-buffer feeds (a prefill, a chunk of several positions into a partly filled
buffer, then single steps; greedy decoding), the stale slots not yet written filled with different noise on each
side; fusing again changes nothing; --strict green. A write at other positions than GQA's, or a mask that is
not GQA's, stays unfused with one line, and --strict fails naming the layer. A build refuses the form (its
runtime grows the cache) in one line."""

import numpy as np
import onnx_ir as ir
import pytest
from click.testing import CliRunner

from tests.fusion.static_cache_graph import AXES, NEGATIVE, SHAPES, Dims, static_decoder
from webbuild.cli import main
from webbuild.errors import SourceError
from webbuild.fusion import parity
from webbuild.fusion.fuse_decoder import fuse_decoder, save
from webbuild.fusion.rule_report import strict_failures
from webbuild.graph.ir import census
from webbuild.pipeline.fuse import check_growing_cache

CASES = [(shape, {}) for shape in SHAPES] + [("h72-q6-kv3-hd32-L29", {axis: s}) for axis, ss in AXES.items()
                                             for s in ss[1:]]
TOLERANCE = 1e-4  # of the logit range


def _strict(report: dict) -> list[str]:
    return strict_failures({"decoder": {"not_fused": report["not_fused"], "ops": report["ops_after"],
                                        "left_over": report["left_over"]}})


def _saved(tmp_path, dims: Dims, **axes):
    src = tmp_path / "source.onnx"
    ir.save(static_decoder(dims, **axes), src)
    model, report = fuse_decoder(static_decoder(dims, **axes), max_positions=dims.buffer)
    return src, save(model, tmp_path / "fused"), model, report


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / (a.max() - a.min()))


@pytest.mark.parametrize("shape,axes", CASES, ids=lambda c: c if isinstance(c, str) else
                         ",".join(f"{k}={v}" for k, v in c.items()) or "default")
def test_fuses_to_one_gqa_per_layer_with_the_source_logits(tmp_path, shape, axes):
    dims = SHAPES[shape]
    src, out, model, report = _saved(tmp_path, dims, **axes)
    ops = census(model)
    assert ops.get("GroupQueryAttention") == dims.layers and "Softmax" not in ops and "ScatterND" not in ops, \
        report["not_fused"]
    assert not _strict(report) and report["static_kv"]
    gqa = [n for n in model.graph if n.op_type == "GroupQueryAttention"]
    assert {n.inputs[3].name for n in gqa} == {f"past_key_values.{i}.key" for i in range(dims.layers)}
    present = {tuple(o.shape) for o in model.graph.outputs if o.name and o.name.startswith("present.")}
    assert present == {(1, dims.kv, dims.buffer, dims.head_dim)}  # the buffer's length kept
    # a prefill, a chunk into the partly filled buffer, single steps; stale slots differ between the two
    source, fused = parity.StaticRunner(src, stale=0), parity.StaticRunner(out, stale=1)
    rng = np.random.default_rng(3)
    for n in (7, 3, 1, 1, 1):
        embeds = rng.standard_normal((1, n, dims.hidden)).astype(np.float32)
        assert _relative(source.step(embeds), fused.step(embeds)) <= TOLERANCE
        assert source.past is not None and fused.past is not None
        for name, kv in source.past.items():  # the written slots; GQA leaves the others zero
            np.testing.assert_allclose(fused.past[name][:, :, :source.written], kv[:, :, :source.written],
                                       atol=1e-5, rtol=1e-4)


def test_greedy_decoding_over_the_buffer_agrees(tmp_path):
    dims = Dims()
    src, out, _, _ = _saved(tmp_path, dims)
    table = np.random.default_rng(1).standard_normal((dims.vocab, dims.hidden)).astype(np.float32)
    r = parity.compare(parity.StaticRunner(src), parity.StaticRunner(out, stale=1), table, prefill=10, steps=16)
    assert r["tokens_equal"] and r["max_rel_err"] <= TOLERANCE, r


def test_a_buffer_of_symbolic_length_is_probed_at_the_caches_length(tmp_path):
    """The buffers' length left symbolic: checked over the positions GQA's caches reach; runs at any length."""
    dims = Dims()
    src = tmp_path / "source.onnx"
    ir.save(static_decoder(dims, symbolic=True), src)
    model, report = fuse_decoder(static_decoder(dims, symbolic=True), max_positions=64)
    assert census(model).get("GroupQueryAttention") == dims.layers and not _strict(report), report["not_fused"]
    out = save(model, tmp_path / "fused")
    table = np.random.default_rng(1).standard_normal((dims.vocab, dims.hidden)).astype(np.float32)
    r = parity.compare(parity.StaticRunner(src, length=dims.buffer), parity.StaticRunner(out, 1, dims.buffer), table,
                       prefill=10, steps=16)
    assert r["tokens_equal"] and r["max_rel_err"] <= TOLERANCE, r


def test_fusing_the_fused_graph_again_changes_nothing():
    model, report = fuse_decoder(static_decoder(Dims()), max_positions=Dims().buffer)
    again, second = fuse_decoder(model, max_positions=Dims().buffer)
    assert census(again) == report["ops_after"] and not second["fused"] and not second["not_fused"]


@pytest.mark.parametrize("axis,spelling", [(a, s) for a, ss in NEGATIVE.items() for s in ss])
def test_a_write_or_mask_gqa_does_not_compute_stays_with_one_line(axis, spelling):
    dims = SHAPES["h72-q6-kv3-hd32-L29"]
    model, report = fuse_decoder(static_decoder(dims, **{axis: spelling}), max_positions=dims.buffer)
    ops = census(model)
    assert "GroupQueryAttention" not in ops and ops["Softmax"] == ops["ScatterND"] // 2 == dims.layers
    misses = [m for m in report["not_fused"] if m["rule"] == "gqa"]
    assert [m["at"] for m in misses] == [f"/model/layers.{i}/self_attn/Softmax" for i in range(dims.layers)]
    expected = {"fixed_offset": "ScatterND writes the new K/V rows elsewhere than GroupQueryAttention does",
                "valid_only": "not the causal mask GroupQueryAttention applies"}[spelling]
    assert all(expected in m["why"] and m["why"].startswith("a static KV cache written in place by ScatterND: ")
               and "\n" not in m["why"] for m in misses), misses
    assert _strict(report) == [f"decoder: {dims.layers} attention patterns not fused"]


@pytest.mark.parametrize("spelling", ["time_major", "fixed_offset"])
def test_webbuild_fuse_strict(tmp_path, spelling):
    """The command: green on the ScatterND form GQA computes, exit code 1 naming the layers on one it does not."""
    src = tmp_path / "src" / "decoder.onnx"
    src.parent.mkdir()
    ir.save(static_decoder(Dims(), write=spelling), src)
    result = CliRunner().invoke(main, ["fuse", str(src), "-o", str(tmp_path / "out"), "--no-quantize", "--strict"])
    if spelling == "time_major":
        assert result.exit_code == 0, result.output
        assert "over a static KV cache written by ScatterND" in result.output
        return
    assert result.exit_code == 1, result.output
    assert "decoder: 2 attention patterns not fused (--strict" in result.output
    assert "at /model/layers.0/self_attn/Softmax, /model/layers.1/self_attn/Softmax" in result.output


def test_a_build_refuses_a_static_cache_in_one_line(tmp_path):
    _, report = fuse_decoder(static_decoder(Dims()), max_positions=Dims().buffer)
    assert report["static_kv"] == [f"past_key_values.{i}.{k}" for i in range(2) for k in ("key", "value")]
    with pytest.raises(SourceError) as e:
        check_growing_cache(report, tmp_path / "src")
    assert "\n" not in str(e.value) and "static KV cache" in str(e.value) and "webbuild fuse" in str(e.value)
    check_growing_cache({"static_kv": []}, tmp_path / "src")  # a growing cache passes

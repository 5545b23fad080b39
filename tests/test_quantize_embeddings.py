"""input_ids path: GatherBlockQuantized lookup (sharing lm_head's int4 weight when tied) + audio splice."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.quantize_graphs import initializer, model, nbits_weight, nodes_of, run
from webbuild.config import Quantize
from webbuild.quantize.embeddings import add_input_ids
from webbuild.quantize.quantize_matmuls import quantize_matmuls

V, H = 80, 64
RNG = np.random.default_rng(2)
TABLE = RNG.standard_normal((V, H)).astype(np.float32)


def _decoder(table: np.ndarray):
    """inputs_embeds -> (embeds passthrough, logits = embeds @ lm_head); lm_head = table.T (tied)."""
    nodes = [helper.make_node("Identity", ["inputs_embeds"], ["embeds"]),
             helper.make_node("MatMul", ["inputs_embeds", "lm_head.weight"], ["logits"], name="/lm_head/MatMul")]
    g = model(nodes, [helper.make_tensor_value_info("inputs_embeds", TensorProto.FLOAT, ["batch", "seq_len", H])],
              [helper.make_tensor_value_info("embeds", TensorProto.FLOAT, None),
               helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)],
              {"lm_head.weight": np.ascontiguousarray(table.T)})
    return quantize_matmuls(g, Quantize())


def _feeds(ids, audio, offset):
    return {"input_ids": np.array([ids], np.int64), "audio_features": audio[None].astype(np.float32),
            "audio_offset": np.array([offset], np.int64)}


def _expected(table, ids, audio, offset):
    x = table[ids].copy()
    x[offset:offset + len(audio)] = audio
    return x


def test_tied_table_shares_lm_head_weight_and_matches_its_dequantization_exactly():
    m = _decoder(TABLE)
    report = add_input_ids(m, TABLE)
    assert report["tied_shared"]
    (gbq,) = nodes_of(m, "GatherBlockQuantized")
    (lm,) = nodes_of(m, "MatMulNBits")
    assert gbq.domain == "com.microsoft" and gbq.input[0] == lm.input[1]  # one packed weight, two readers
    uint8 = [t for t in m.graph.initializer if t.data_type == TensorProto.UINT8]
    assert len(uint8) == 1 and initializer(m, uint8[0].name).nbytes == V * H // 2
    assert not [t for t in m.graph.initializer if t.data_type == TensorProto.FLOAT and list(t.dims) in ([V, H], [H, V])]
    assert [i.name for i in m.graph.input] == ["input_ids", "audio_features", "audio_offset"]
    deq = nbits_weight(m, lm).T  # [V, H] as the lm_head sees it
    ids, audio = [3, 7, 7, 1, 0, 79, 42], RNG.standard_normal((3, H)).astype(np.float32)
    embeds, _ = run(m, _feeds(ids, audio, 2))
    np.testing.assert_array_equal(embeds[0], _expected(deq, ids, audio, 2))
    # against the float table: within int4 error (one step of absmax / 8 per 32-block)
    err = np.abs(embeds[0] - _expected(TABLE, ids, audio, 2))
    assert 0 < err.max() <= np.abs(TABLE).max() / 8


@pytest.mark.parametrize("offset,a_len", [(0, 0), (5, 0), (0, 2), (4, 3)])
def test_audio_splice_positions(offset, a_len):
    m = _decoder(TABLE)
    add_input_ids(m, TABLE)
    deq = nbits_weight(m, nodes_of(m, "MatMulNBits")[0]).T
    ids, audio = [10, 11, 12, 13, 14, 15, 16], RNG.standard_normal((a_len, H)).astype(np.float32)
    embeds, logits = run(m, _feeds(ids, audio, offset))
    np.testing.assert_array_equal(embeds[0], _expected(deq, ids, audio, offset))
    assert logits.shape == (1, len(ids), V)


def test_audio_splice_batch_of_two_takes_each_rows_own_audio():
    m = _decoder(TABLE)
    add_input_ids(m, TABLE)
    deq = nbits_weight(m, nodes_of(m, "MatMulNBits")[0]).T
    ids = np.array([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]], np.int64)
    audio = RNG.standard_normal((2, 2, H)).astype(np.float32)
    embeds, _ = run(m, {"input_ids": ids, "audio_features": audio, "audio_offset": np.array([1], np.int64)})
    for b in range(2):
        np.testing.assert_array_equal(embeds[b], _expected(deq, list(ids[b]), audio[b], 1))


def test_untied_table_is_quantized_on_its_own():
    other = RNG.standard_normal((V, H)).astype(np.float32)
    m = _decoder(other)  # lm_head is not TABLE
    report = add_input_ids(m, TABLE)
    assert not report["tied_shared"]
    (gbq,) = nodes_of(m, "GatherBlockQuantized")
    assert gbq.input[0] != nodes_of(m, "MatMulNBits")[0].input[1]
    assert initializer(m, gbq.input[0]).shape == (V, H // 32, 16)
    ids = [1, 2, 3]
    embeds, _ = run(m, _feeds(ids, np.zeros((0, H), np.float32), 0))
    assert np.abs(embeds[0] - TABLE[ids]).max() <= np.abs(TABLE).max() / 8


@pytest.mark.parametrize("rows", [7, 80, 1000])
def test_tied_check_in_row_chunks_sees_every_row(rows):
    """is_tied compares a few rows at a time; a table that differs in its last row only is not tied."""
    from webbuild.quantize.embeddings import is_tied, lm_head_node

    m = _decoder(TABLE)
    lm = lm_head_node(m, V, H)
    assert is_tied(m, lm, TABLE, rows=rows)
    moved = TABLE.copy()
    moved[-1] += 4.0  # far beyond one quantization step (absmax / 8 of a block)
    assert not is_tied(m, lm, moved, rows=rows)

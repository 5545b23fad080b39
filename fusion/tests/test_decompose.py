"""decompose() undoes the fusion; fusing its output gives back the same graph (census and outputs)."""

import onnx_ir as ir
import pytest

from fusion import parity
from fusion._ir import census
from fusion.decompose import decompose
from fusion.fuse import fuse_decoder, save
from fusion.validate import check_file

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

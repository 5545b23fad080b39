import json

import onnx_ir as ir

from fusion.cli import run_fuse


def test_run_fuse_writes_graph_report_and_table(zoo, tmp_path):
    lines = []
    rep = run_fuse(zoo.source("split", "torchscript"), tmp_path / "out", tmp_path / "r.json", lines.append)
    assert (tmp_path / "out" / "decoder.onnx").is_file() and (tmp_path / "out" / "decoder.onnx.data").is_file()
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["ops_after"] == rep["ops_after"] and saved["nodes_before"] > saved["nodes_after"]
    row = next(line for line in lines if line.startswith("GroupQueryAttention"))
    assert row.split()[1:] == ["0", "->", "4"]
    assert any(line.startswith("Softmax") and line.split()[-1] == "0" for line in lines)
    assert len(list(ir.load(tmp_path / "out" / "decoder.onnx").graph)) == rep["nodes_after"]


def test_missing_source_is_a_clear_error(tmp_path):
    import pytest

    with pytest.raises(FileNotFoundError, match="split-layout folder or a merged"):
        run_fuse(tmp_path / "nope", tmp_path / "out", None, lambda _: None)

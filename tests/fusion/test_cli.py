import json
import shutil

import onnx_ir as ir
import pytest

from webbuild.errors import SourceError
from webbuild.pipeline.fuse import run_fuse, summary


def attrs(node: ir.Node) -> dict:
    return {k: a.value for k, a in node.attributes.items()}


def test_run_fuse_writes_graph_report_and_table(zoo, tmp_path):
    rep = run_fuse(zoo.source("qwen3-asr-split", "torchscript"), tmp_path / "out", tmp_path / "r.json")
    lines = summary(rep)
    assert (tmp_path / "out" / "decoder.onnx").is_file() and (tmp_path / "out" / "decoder.onnx.data").is_file()
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["ops_after"] == rep["ops_after"] and saved["nodes_before"] > saved["nodes_after"]
    row = next(line for line in lines if line.startswith("GroupQueryAttention"))
    assert row.split()[1:] == ["0", "->", "4"]
    assert any(line.startswith("Softmax") and line.split()[-1] == "0" for line in lines)
    assert len(list(ir.load(tmp_path / "out" / "decoder.onnx").graph)) == rep["nodes_after"]


def test_default_quantization_int4_block_32_level_4_and_tied_lookup(zoo, tmp_path):
    rep = run_fuse(zoo.source("qwen3-asr-split", "torchscript"), tmp_path / "out")
    model = ir.load(tmp_path / "out" / "decoder.onnx")
    nbits = [n for n in model.graph if n.op_type == "MatMulNBits"]
    assert len(nbits) == rep["ops_fused"]["MatMul"] == rep["ops_after"]["MatMulNBits"]
    assert "MatMul" not in rep["ops_after"]
    assert {(a["bits"], a["block_size"], a["accuracy_level"]) for a in map(attrs, nbits)} == {(4, 32, 4)}
    assert all(len(n.inputs) == 3 for n in nbits)  # symmetric: no zero points
    lookup = next(n for n in model.graph if n.op_type == "GatherBlockQuantized")
    assert lookup.inputs[0] is nbits[-1].inputs[1] and rep["quantize"]["embeddings"]["tied_shared"]  # lm_head's weight
    assert [i.name for i in model.graph.inputs][:4] == ["input_ids", "audio_features", "audio_offset", "attention_mask"]


def test_no_quantize_keeps_float_weights_and_inputs_embeds(zoo, tmp_path):
    rep = run_fuse(zoo.source("qwen3-asr-split", "torchscript"), tmp_path / "out", quantize=False)
    assert "quantize" not in rep and "MatMulNBits" not in rep["ops_after"] and rep["ops_after"]["MatMul"] > 0
    assert ir.load(tmp_path / "out" / "decoder.onnx").graph.inputs[0].name == "inputs_embeds"


def test_quantizing_needs_the_embedding_table_beside_the_source(zoo, tmp_path):
    merged = zoo.source("merged", "torchscript")
    for f in merged.parent.glob("decoder_model_merged.onnx*"):
        shutil.copyfile(f, tmp_path / f.name)
    with pytest.raises(SourceError, match="config.json and embed_tokens.bin.*--no-quantize"):
        run_fuse(tmp_path / merged.name, tmp_path / "out")
    run_fuse(tmp_path / merged.name, tmp_path / "out", quantize=False)


def test_missing_source_is_a_clear_error(tmp_path):
    with pytest.raises(SourceError, match="nope: not found; give a source folder or a decoder .onnx"):
        run_fuse(tmp_path / "nope", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="empty: found none of decoder_init.onnx \\(qwen3-asr-split\\), "):
        run_fuse(tmp_path / "empty", tmp_path / "out")

"""Layout v2 (issue 16): the zoo's v2 export of the tiny example's model has the interface
webbuild.reference.source_v2 documents, and `webbuild model.yaml` builds a site from it that transcribes
the example's samples exactly as the site built from the split source does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml

from tests.command import webbuild
from tests.example_config import EXAMPLE, example_config, sample_text
from webbuild.layouts import V2
from webbuild.reference import source_v2 as v2
from webbuild.reference.audio import read_wav
from webbuild.reference.transcribe import cpu_session, load_transcriber

_DECODER = json.loads((EXAMPLE / "model" / "config.json").read_text())["decoder"]  # the example's decoder block
LAYERS, KV, HEAD_DIM, HIDDEN, VOCAB = (_DECODER[k] for k in ("num_layers", "num_key_value_heads", "head_dim",
                                                             "hidden_size", "vocab_size"))
pytestmark = [pytest.mark.torch]  # the v2 export is the zoo's (webbuild.zoo needs the zoo extra)



@pytest.fixture(scope="session")
def v2_export(tmp_path_factory) -> Path:
    """The zoo's v2 export of examples/tiny-asr/model (a split export)."""
    from webbuild.zoo.export_v2 import convert

    return convert(EXAMPLE / "model", tmp_path_factory.mktemp("layout-v2") / "model")


def _model_yaml(folder: Path, layout: str, source: Path) -> Path:
    """The example's model.yaml with `source` in `layout` and absolute sample paths."""
    cfg = example_config()
    cfg["source"] = {"layout": layout, "dir": str(source)}
    path = folder / f"{layout}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="session")
def sites(v2_export, example_dist, tmp_path_factory) -> dict[str, Path]:
    """dist/ built by `webbuild model.yaml` from the v2 export and from the example's split source (the
    example as is)."""
    work = tmp_path_factory.mktemp("layout-v2-sites")
    r = webbuild(_model_yaml(work, "qwen3-asr-v2", v2_export), "-o", work / "qwen3-asr-v2")
    assert r.returncode == 0, r.stderr
    return {"qwen3-asr-v2": work / "qwen3-asr-v2", "qwen3-asr-split": example_dist}


def _io(path: Path) -> tuple[dict, dict]:
    graph = onnx.load(str(path), load_external_data=False).graph
    types = lambda values: {v.name: onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)  # noqa: E731
                            for v in values}
    return types(graph.input), types(graph.output)


def test_v2_export_files_names_and_dtypes(v2_export):
    assert {p.name for p in v2_export.iterdir()} == {*V2.files, "prompt_config.json",
                                                     "preprocessor_config.json"}
    f32, i64 = np.dtype(np.float32), np.dtype(np.int64)
    outputs = {"logits": f32, "present_keys": f32, "present_values": f32}
    assert _io(v2_export / v2.INIT) == ({"input_embeds": f32, "position_ids": i64}, outputs)
    assert _io(v2_export / v2.STEP) == (
        {"input_embeds": f32, "position_ids": i64, "past_keys": f32, "past_values": f32}, outputs)
    prompt_config = json.loads((v2_export / "prompt_config.json").read_text())
    assert prompt_config["embedding"] == {"file": v2.TABLE, "dtype": "int8", "shape": [VOCAB, HIDDEN],
                                          "scales_file": v2.SCALES}


def test_v2_decoders_share_int4_block32_weights(v2_export):
    """Both graphs read one weights file; every weight MatMul, lm_head included, is 4-bit block-32
    MatMulNBits (4 layers x 7 + lm_head); no graph holds the embedding table."""
    for name in (v2.INIT, v2.STEP):
        model = onnx.load(str(v2_export / name), load_external_data=False)
        locations = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
        assert locations == {v2.WEIGHTS}
        nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
        assert len(nbits) == LAYERS * 7 + 1
        settings = [{a.name: a.i for a in n.attribute if a.name in ("bits", "block_size")} for n in nbits]
        assert all(s == {"bits": 4, "block_size": 32} for s in settings)
        assert not any(len(t.dims) == 2 and tuple(t.dims) == (VOCAB, HIDDEN) for t in model.graph.initializer)
    split_bytes = (EXAMPLE / "model" / "decoder_weights.data").stat().st_size
    assert (v2_export / v2.WEIGHTS).stat().st_size < split_bytes / 4, "weights stored twice or not int4"


def test_v2_shapes_on_onnxruntime(v2_export):
    """Prefill: last-position logits [1, 1, V], stacked KV [L, 1, kv, S, hd]; a step adds one position."""
    s = 7
    logits, keys, values = cpu_session(v2_export / v2.INIT).run(None, {
        "input_embeds": np.random.default_rng(0).standard_normal((1, s, HIDDEN), np.float32),
        "position_ids": np.arange(s, dtype=np.int64)[None]})
    assert logits.shape == (1, 1, VOCAB) and keys.shape == values.shape == (LAYERS, 1, KV, s, HEAD_DIM)
    logits, keys, values = cpu_session(v2_export / v2.STEP).run(None, {
        "input_embeds": np.zeros((1, 1, HIDDEN), np.float32), "position_ids": np.array([[s]], np.int64),
        "past_keys": keys, "past_values": values})
    assert logits.shape == (1, 1, VOCAB) and keys.shape == (LAYERS, 1, KV, s + 1, HEAD_DIM)


def test_v2_int8_table_is_the_float_table_per_row(v2_export):
    cfg = json.loads((v2_export / "config.json").read_text())
    table = v2.embed_table(v2_export, cfg)
    source = np.fromfile(EXAMPLE / "model" / "embed_tokens.bin", np.float32).reshape(VOCAB, HIDDEN)
    scales = np.fromfile(v2_export / v2.SCALES, np.float32)
    assert np.all(np.abs(table - source) <= scales[:, None] / 2 + 1e-7)
    assert np.abs(np.fromfile(v2_export / v2.TABLE, np.int8)).max() == 127


def test_site_from_v2_transcribes_as_from_split(sites):
    """The Python reference on each built site's own graphs (both variants) gives the same tokens for
    the example's 4 samples, and the model.yaml texts. Both sites are int4 block 32: the v2 source
    arrives quantized so (and the build keeps its MatMulNBits), the split source is quantized by the
    build's default `quantize:` settings (rtn, 4 bits, block 32), so they compare under the same
    quantization; the v2 site's embedding lookup shares lm_head's int4 weight as the split site's does."""
    samples = yaml.safe_load((EXAMPLE / "model.yaml").read_text())["site"]["samples"]
    clips = [read_wav(EXAMPLE / s["audio"]) for s in samples]
    for variant in ("fp32", "fp16"):
        runs = {layout: load_transcriber(dist, variant) for layout, dist in sites.items()}
        tokens = {layout: [r.generate(c) for c in clips] for layout, r in runs.items()}
        assert tokens["qwen3-asr-v2"] == tokens["qwen3-asr-split"], variant
        assert [runs["qwen3-asr-v2"].transcribe(c) for c in clips] == [s["text"] for s in samples]
    report = json.loads((sites["qwen3-asr-v2"] / "build-report.json").read_text())
    assert report["graphs"]["decoder"]["not_fused"] == []
    assert report["graphs"]["decoder"]["fused"]["ops"]["GroupQueryAttention"] == LAYERS


def test_webbuild_transcribe_reads_a_v2_source(v2_export):
    r = webbuild("transcribe", v2_export, *(EXAMPLE / "samples").glob("sample-1.wav"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\t")[1] == sample_text(0)


def _broken_copy(v2_export: Path, tmp_path: Path, name: str, data: bytes | None) -> Path:
    model = tmp_path / "model"
    shutil.copytree(v2_export, model)
    if data is None:
        (model / name).unlink()
    else:
        (model / name).write_bytes(data)
    return _model_yaml(tmp_path, "qwen3-asr-v2", model)


@pytest.mark.parametrize("name, data, message", [
    (v2.SCALES, None, f"source.dir: {{dir}} lacks {v2.SCALES}, which layout 'qwen3-asr-v2' needs"),
    (v2.TABLE, b"\0" * 1000, f"{{dir}}/{v2.TABLE}: 1000 bytes, expected {VOCAB * HIDDEN} ({VOCAB} x {HIDDEN} int8, "
                             f"from config.json decoder.vocab_size and hidden_size); {v2.FIX}"),
    (v2.SCALES, b"\0" * 8, f"{{dir}}/{v2.SCALES}: 8 bytes, expected {4 * VOCAB} ({VOCAB} float32, "
                           f"from config.json decoder.vocab_size and hidden_size); {v2.FIX}"),
])
def test_broken_v2_source_is_one_error_line(v2_export, tmp_path, name, data, message):
    """A missing file (model.yaml's check), a table of the wrong size (the source stage's): exit code 2,
    the file, what is wrong and the fix."""
    r = webbuild(_broken_copy(v2_export, tmp_path, name, data), "-o", tmp_path / "dist")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert message.format(dir=tmp_path / "model") in r.stderr


def test_v2_source_with_split_graphs_names_the_file(v2_export, tmp_path):
    """decoder_init.int4.onnx that is the split layout's prefill (input_ids, ...): its inputs are named."""
    yaml_path = _broken_copy(v2_export, tmp_path, v2.INIT, (EXAMPLE / "model" / "decoder_init.onnx").read_bytes())
    shutil.copy(EXAMPLE / "model" / "decoder_weights.data", tmp_path / "model")  # what that graph reads
    r = webbuild(yaml_path, "-o", tmp_path / "dist")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    line = next(x for x in r.stderr.splitlines() if x.startswith("error: "))
    assert f"{tmp_path / 'model' / v2.INIT}: inputs ['input_ids', 'position_ids', 'audio_features', " \
           "'audio_offset'], expected ['input_embeds', 'position_ids'] (layout v2)" in line

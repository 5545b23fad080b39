"""Bad inputs found by trying the commands as a new user would: each is one `error:` line naming the user's
file, what is wrong and what to do, exit code 2, and nothing half-written."""

from __future__ import annotations

import json
import resource
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.example_config import EXAMPLE, REPO
from tests.inputs import SAMPLES, invoke, replace, source_copy

FIX = "re-export or re-download the model"


def _edit_graph(path: Path, edit) -> None:
    """Rewrite the graph at `path` (its weights file untouched) after `edit(model)`."""
    model = onnx.load(path, load_external_data=False)
    edit(model)
    replace(path, model.SerializeToString())


def _rename_input(old: str, new: str):
    def edit(model: onnx.ModelProto) -> None:
        next(v for v in model.graph.input if v.name == old).name = new
        for node in model.graph.node:
            node.input[:] = [new if name == old else name for name in node.input]
    return edit


def _nothing_left(folder: Path) -> None:
    """No output, no staging folder, no lock file beside it."""
    assert not (folder / "out").exists() and [p.name for p in folder.iterdir() if p.name.startswith(".")] == []


@pytest.fixture
def source(tmp_path):
    return source_copy(tmp_path)


def test_model_yaml_that_is_not_utf8(tmp_path):
    config = tmp_path / "model.yaml"
    config.write_bytes(b"name: caf\xe9\n")
    assert invoke(config, "-o", tmp_path / "out").error_line() == (
        f"error: {config}: not UTF-8 text (byte 9 is 0xe9); save it as UTF-8")


def test_a_renamed_decoder_input_in_build_and_fuse(source, tmp_path):
    config, model = source
    _edit_graph(model / "decoder_init.onnx", _rename_input("input_ids", "ids"))
    expected = (f"{model / 'decoder_init.onnx'}: inputs: no input_ids, unexpected ids (expected input_ids, "
                f"position_ids, audio_features, audio_offset); {FIX}")
    assert invoke(config, "-o", tmp_path / "out").error_line() == f"error: stage source: {expected}"
    assert invoke("fuse", model, "-o", tmp_path / "out").error_line() == f"error: {expected}"
    _nothing_left(tmp_path)


def test_a_dropped_decoder_output(source, tmp_path):
    config, model = source
    _edit_graph(model / "decoder_step.onnx", lambda m: m.graph.output.pop())
    line = invoke(config, "-o", tmp_path / "out").error_line()
    assert line == (f"error: stage source: {model / 'decoder_step.onnx'}: outputs: no present_values (expected "
                    f"logits, present_keys, present_values); {FIX}")
    _nothing_left(tmp_path)


def test_a_truncated_embedding_table(source, tmp_path):
    config, model = source
    replace(model / "embed_tokens.bin", (EXAMPLE / "model" / "embed_tokens.bin").read_bytes()[:1000])
    vocab, hidden = json.loads((EXAMPLE / "model" / "config.json").read_text())["embed_tokens_shape"]
    assert invoke(config, "-o", tmp_path / "out").error_line() == (
        f"error: stage source: {model / 'embed_tokens.bin'}: 1000 bytes, expected {vocab * hidden * 4} "
        f"({vocab} x {hidden} float32 from config.json); {FIX}")
    _nothing_left(tmp_path)


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_garbage_json_in_build_and_transcribe(source, tmp_path, name):
    config, model = source
    replace(model / name, b"{\"decoder\": \xff garbage")
    expected = f"{model / name}: not valid JSON ("
    assert expected in invoke(config, "-o", tmp_path / "out").error_line()
    assert expected in invoke("transcribe", model, SAMPLES[0]).error_line()
    _nothing_left(tmp_path)


def test_a_config_json_without_what_the_build_reads(source, tmp_path):
    config, model = source
    cfg = json.loads((model / "config.json").read_text())
    cfg["decoder"]["num_layers"] = "four"
    replace(model / "config.json", json.dumps(cfg).encode())
    assert invoke(config, "-o", tmp_path / "out").error_line() == (
        f"error: stage source: {model / 'config.json'}: decoder.num_layers is 'four', expected a positive "
        f"integer; {FIX}")


def test_a_truncated_adapter_with_a_valid_header(tmp_path):
    """Found when the model.yaml is read, not after the check stage's seconds."""
    config, _ = source_copy(tmp_path, adapters=True)
    weights = tmp_path / "klatt" / "adapter_model.safetensors"
    replace(weights, weights.read_bytes()[:-1000])
    line = invoke(config, "-o", tmp_path / "out").error_line()
    assert f"{weights}: truncated: tensor " in line and "re-download or re-train the adapter" in line
    _nothing_left(tmp_path)


def test_an_encoder_input_renamed_names_the_source_file(source, tmp_path):
    config, model = source
    _edit_graph(model / "encoder.onnx", _rename_input("mel", "feats"))
    line = invoke(config, "-o", tmp_path / "out").error_line()
    assert line == (f"error: stage source: {model / 'encoder.onnx'}: inputs: no mel, unexpected feats "
                    f"(expected mel); {FIX}")
    assert "/.out-" not in line


def _full_disk(limit: int):
    """A file size limit in a subprocess: writes past it fail as on a full disk (Python ignores SIGXFSZ)."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


@pytest.mark.parametrize("command", ["fuse", "build"])
def test_a_full_disk_while_fusing(source, tmp_path, command):
    config, model = source
    out = tmp_path / "out"
    args = ["fuse", model, "-o", out] if command == "fuse" else [config, "-o", out]
    r = subprocess.run([sys.executable, "-m", "webbuild.cli", *map(str, args)], capture_output=True, text=True,
                       cwd=REPO, timeout=600, preexec_fn=_full_disk(4_000_000))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.rstrip().splitlines()[-1] == (
        f"error: cannot write the new {out}: File too large; free disk space on its file system or write "
        "elsewhere with -o")
    _nothing_left(tmp_path)


def test_fuse_keeps_the_earlier_output_until_the_new_one_is_complete(source, tmp_path):
    _, model = source
    out = tmp_path / "out"
    assert invoke("fuse", model, "-o", out, "--no-quantize").code == 0
    (out / "notes.txt").write_text("mine")
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    _edit_graph(model / "decoder_init.onnx", _rename_input("input_ids", "ids"))
    invoke("fuse", model, "-o", out).error_line()
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_transcribe_and_bench_check_the_shards_of_a_site(example_dist, tmp_path):
    from tests.inputs import link_tree

    site = link_tree(example_dist, tmp_path / "dist")
    shard = sorted((site / "model" / "shards").iterdir())[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    replace(shard, bytes(data))
    for args in (["transcribe", site, SAMPLES[0]], ["bench", site, "--ep", "wasm"]):
        line = invoke(*args).error_line()
        assert line.startswith(f"error: {shard}: sha256 ") and line.endswith("; rebuild the site or copy it again")


def test_random_weights_of_the_right_size_are_reported_and_warned(source, tmp_path):
    """The samples' WER says what token agreement with the source (random too) cannot: the build ships (exit 0)
    with a warning per variant and each sample's WER in the report (here 29 and 35: a long garbage answer)."""
    config, model = source
    weights = model / "decoder_weights.data"
    rng = np.random.default_rng(0)
    replace(weights, rng.standard_normal(weights.stat().st_size // 4, dtype=np.float32).tobytes())
    config.write_text(config.read_text() + "variants: [fp32]\n")
    run = invoke(config, "-o", tmp_path / "out")
    assert run.code == 0, (run.stderr, run.exception)
    warning = next(line for line in run.stderr.splitlines() if "warning: !!!!!!!! variant fp32: " in line)
    assert "2 of 2 samples above verify.max_wer 0 (worst sample-" in warning and "weights may be wrong" in warning
    samples = json.loads((tmp_path / "out" / "build-report.json").read_text())["variants"]["fp32"]["check"]["samples"]
    assert sorted(samples) == ["sample-1.wav", "sample-2.wav"]
    assert all(s["wer"] > 0.5 and s["expected"] == "x" for s in samples.values())


def test_fail_on_wer_stops_the_build(tmp_path):
    from webbuild.errors import CheckFailed
    from webbuild.pipeline.sample_wer import report_wer

    rows = {"a.wav": {"expected": "hello", "transcript": "!!!!", "wer": 1.0}}
    report_wer("fp32", rows, 0.5, fail=False)  # a warning only
    with pytest.raises(CheckFailed, match=r"1 of 1 samples above verify.max_wer 0.5 \(worst a.wav: WER 1.00, heard "
                                          r"'!!!!' for 'hello'\)") as exc:
        report_wer("fp32", rows, 0.5, fail=True)
    assert exc.value.exit_code == 1


def test_verify_checks_a_local_site_before_starting_a_browser(example_dist, tmp_path):
    pytest.importorskip("playwright")  # else verify stops earlier, asking for its extra
    from tests.inputs import link_tree

    site = link_tree(example_dist, tmp_path / "dist")
    shard = sorted((site / "model" / "shards").iterdir())[-1]
    replace(shard, shard.read_bytes()[:-10])
    assert invoke("verify", site).error_line().startswith(f"error: {shard}: {shard.stat().st_size} bytes, the ")
    replace(site / "samples.json", b"{")
    shutil.copy2(example_dist / "model" / "shards" / shard.name, shard)
    assert invoke("verify", site).error_line().startswith(f"error: {site / 'samples.json'}: not valid JSON (")


def test_verify_of_a_missing_folder_says_so(tmp_path):
    pytest.importorskip("playwright")  # else verify stops earlier, asking for its extra
    assert invoke("verify", tmp_path / "nowhere").error_line() == (
        f"error: {tmp_path / 'nowhere'}: no such folder; pass a built site folder (webbuild model.yaml) or a URL")


def test_verify_of_a_url_nothing_answers_is_one_line():
    """Nothing listening was a 63-line Playwright traceback: a plain HTTP request first, before any browser."""
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens on it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/"
    run = invoke("verify", url)
    assert (run.code, run.error_line()) == (2, f"error: {url}: cannot reach it ([Errno 111] Connection refused); "
                                               "check the URL, and that the site is being served there")


@pytest.mark.parametrize("layout", ["qwen3-asr-split", "merged"])
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_the_zoo_exports_pass_the_source_check(zoo_export, layout, exporter):
    """Good exports are not refused: both exporters spell shapes their own way (dynamo fixes a step's
    logits at one position)."""
    from webbuild.layouts import layout as find
    from webbuild.reference.source_files import check_source

    folder = zoo_export(layout, exporter)
    assert check_source(folder, find(layout))["decoder"]["num_layers"] > 0


def test_an_fp16_decoder_out_of_topological_order_is_sorted_and_fused(tmp_path):
    """onnxruntime's float16 converter with keep_io_types=True (as transformers.js converts) writes the input
    casts after their users: onnxruntime loads the graph, and fuse refused it ("Nodes in a graph must be
    topologically sorted"). It sorts what onnxruntime accepts, and says so in its report."""
    import onnxruntime
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from webbuild.graph.load import UNSORTED

    src = tmp_path / "fp16" / "decoder_init.onnx"
    src.parent.mkdir()
    fp16 = convert_float_to_float16(onnx.load(EXAMPLE / "model" / "decoder_init.onnx"), keep_io_types=True)
    onnx.save(fp16, src, save_as_external_data=True, location="decoder_init.onnx.data")
    with pytest.raises(onnx.checker.ValidationError, match=UNSORTED):
        onnx.checker.check_model(str(src))
    onnxruntime.InferenceSession(src, providers=["CPUExecutionProvider"])  # loads as it is
    report = tmp_path / "fuse.json"
    run = invoke("fuse", src, "-o", tmp_path / "out", "--no-quantize", "--report", report)
    assert run.code == 0, (run.stderr, run.exception)
    rep = json.loads(report.read_text())
    assert rep["sorted_nodes"] == 2 and rep["ops_after"]["GroupQueryAttention"] == 4
    assert rep["notes"][0].startswith("sorted the nodes into topological order: 2 came before the node making")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["decoder.onnx", "decoder.onnx.data"]


def test_a_graph_whose_nodes_form_a_cycle_is_one_line(tmp_path):
    h = onnx.helper
    x = h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    nodes = [h.make_node("Add", ["x", "b"], ["a"]), h.make_node("Relu", ["a"], ["b"])]  # a needs b, b needs a
    graph = h.make_graph(nodes, "cycle", [x], [h.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [1])])
    onnx.save(h.make_model(graph), tmp_path / "decoder.onnx")
    line = invoke("fuse", tmp_path / "decoder.onnx", "-o", tmp_path / "out", "--no-quantize").error_line()
    assert line.startswith(f"error: {tmp_path / 'decoder.onnx'}: not a valid ONNX graph (its nodes form a cycle: ")
    assert line.endswith(f"); {FIX}")

"""webbuild.forms.wasm_twin on the example's quantized decoder: no int4 operator left, every weight
folded to float32 by onnxruntime at session creation, and the logits of the int4 graph; the int8 form on
one projection: within a percent of the float MatMul, its weights derived by the page (runtime/int8.js,
in Node) byte for byte as the Python reference derives them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from webbuild.errors import BuildError
from webbuild.forms.wasm_twin import foldable, wasm_graph
from webbuild.graph.packing import int8_weights
from webbuild.pipeline.fuse import run_fuse

EXAMPLE_MODEL = Path(__file__).resolve().parents[1] / "examples" / "tiny-asr" / "model"
RUNTIME = Path(__file__).resolve().parents[1] / "webbuild" / "template" / "runtime"
INT4_OPS = {"MatMulNBits", "GatherBlockQuantized"}


@pytest.fixture(scope="module")
def quantized(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fused") / "q"
    run_fuse(EXAMPLE_MODEL, out)
    return out / "decoder.onnx"


def session(path: Path, optimized: Path | None = None) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if optimized:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def prefill_logits(s: ort.InferenceSession, ids: list[int]) -> np.ndarray:
    shapes = {i.name: i.shape for i in s.get_inputs()}
    feeds = {"input_ids": np.array([ids], np.int64), "audio_offset": np.zeros(1, np.int64),
             "audio_features": np.zeros((1, 0, shapes["audio_features"][2]), np.float32),
             "attention_mask": np.ones((1, len(ids)), np.int64)}
    for name, shape in shapes.items():
        if name.startswith("past_key_values."):
            feeds[name] = np.zeros((1, shape[1], 0, shape[3]), np.float32)
    return s.run(["logits"], feeds)[0][0, -1]


def test_twin_spells_int4_in_standard_ops_that_fold_to_float(quantized, tmp_path):
    twin = quantized.with_name("decoder.wasm.onnx")
    assert wasm_graph(quantized, twin)
    source = onnx.load(str(quantized), load_external_data=False).graph
    graph = onnx.load(str(twin), load_external_data=False).graph
    assert not INT4_OPS & {n.op_type for n in graph.node}
    assert {i.name for i in graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL} <= \
        {i.name for i in source.initializer}  # the same weights file, no new weights
    matmuls = sum(n.op_type == "MatMulNBits" for n in source.node)
    # at session creation every weight's dequantization folds away: one MatMul per MatMulNBits remains
    session(twin, tmp_path / "optimized.onnx")
    folded = onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False).graph
    assert sum(n.op_type == "MatMul" for n in folded.node) == matmuls
    assert not [n.name for n in folded.node if n.op_type == "Transpose" and n.name.startswith("wasm_twin/")]

    ids = [1, 8, 15, 42, 3, 99, 7]
    want, got = prefill_logits(session(quantized), ids), prefill_logits(session(twin), ids)
    assert int(np.argmax(got)) == int(np.argmax(want))
    # onnxruntime CPU's MatMulNBits (accuracy level 4) rounds activations to int8; the twin is exact
    err = np.max(np.abs(got - want)) / np.ptp(want)
    print(f"twin vs int4 graph: {err:.2e} of the logit range")
    assert err < 0.02


def test_twin_refuses_asymmetric_weights(quantized, tmp_path):
    model = onnx.load(str(quantized), load_external_data=False)
    node = next(n for n in model.graph.node if n.op_type == "MatMulNBits")
    node.input.append("zero_points")
    bad = quantized.with_name("asymmetric.onnx")
    onnx.save(model, str(bad))
    with pytest.raises(BuildError, match="zero points"):
        wasm_graph(bad, tmp_path / "twin.onnx")


def test_twin_without_folding_keeps_matmul_nbits_and_rewrites_only_the_lookup(quantized):
    twin = quantized.with_name("decoder.nbits.wasm.onnx")  # beside its weights file
    assert wasm_graph(quantized, twin, form="matmul_nbits")
    source = onnx.load(str(quantized), load_external_data=False)
    graph = onnx.load(str(twin), load_external_data=False).graph
    ops = [n.op_type for n in graph.node]
    assert "GatherBlockQuantized" not in ops  # the wasm build has no kernel for it
    assert ops.count("MatMulNBits") == sum(n.op_type == "MatMulNBits" for n in source.graph.node) > 0
    assert foldable(source)
    ids = [1, 8, 15, 42, 3, 99, 7]
    got, want = prefill_logits(session(twin), ids), prefill_logits(session(quantized), ids)
    assert np.array_equal(got, want)  # the same kernels on the same weights


def test_asymmetric_weights_are_not_foldable(quantized):
    model = onnx.load(str(quantized), load_external_data=False)
    next(n for n in model.graph.node if n.op_type == "MatMulNBits").input.append("zero_points")
    assert not foldable(model)


def int4_projection(folder: Path, k: int = 96, n: int = 40) -> tuple[Path, np.ndarray]:
    """A graph of one int4 MatMulNBits (block 32, weights in its own file) and the float32 weight it
    multiplies by."""
    from onnx import TensorProto, helper

    from webbuild.graph.packing import dequantize
    from webbuild.quantize.requantize import block_quantize

    w = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32)
    packed, scales = block_quantize(w, 4, 32)
    node = helper.make_node("MatMulNBits", ["x", "B", "S"], ["y"], domain="com.microsoft", K=k, N=n, bits=4,
                            block_size=32, accuracy_level=4)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "s", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "s", n])],
                              [onnx.numpy_helper.from_array(packed.reshape(n, -1, 16), "B"),
                               onnx.numpy_helper.from_array(scales.reshape(-1).astype(np.float32), "S")])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    path = folder / "g.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="g.onnx.data", size_threshold=0)
    return path, dequantize(packed, scales, None, k, n, 4, 32)


def test_int8_twin_multiplies_by_the_int4_weight_within_a_percent(tmp_path):
    from webbuild.reference.transcribe import cpu_session

    src, weight = int4_projection(tmp_path)
    twin = tmp_path / "g.wasm.onnx"
    assert wasm_graph(src, twin, form="int8")
    graph = onnx.load(str(twin), load_external_data=False).graph
    assert [n.op_type for n in graph.node] == ["DynamicQuantizeMatMul"]
    plan = json.loads((tmp_path / "g.wasm.int8.json").read_text())
    # nothing new to download: the uint8 weight lives in a file the plan derives from the shipped one
    assert plan["source"] == "g.onnx.data" and not (tmp_path / plan["file"]).exists()
    x = np.random.default_rng(1).standard_normal((1, 5, 96)).astype(np.float32)
    got, want = cpu_session(twin).run(None, {"x": x})[0], x @ weight
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    print(f"int8 twin vs the int4 weight in float: {err:.2e} (rms, relative)")
    assert err < 0.02  # measured 1.0e-2: 8-bit activations per tensor and the weight requantized per column
    assert not np.allclose(got, want, rtol=1e-5, atol=1e-5)  # quantized, not the float MatMul


# K not a multiple of the block: padding dropped; N = 30: int8.js derives four columns at a time, then the rest
@pytest.mark.parametrize("n", [24, 30])
def test_int8_weights_derived_by_the_page_equal_the_python_reference(tmp_path, n):
    src, _ = int4_projection(tmp_path, k=80, n=n)
    assert wasm_graph(src, tmp_path / "g.wasm.onnx", form="int8")
    plan_path = tmp_path / "g.wasm.int8.json"
    want = int8_weights(json.loads(plan_path.read_text()), np.fromfile(tmp_path / "g.onnx.data", np.uint8))
    data, out = tmp_path / "g.onnx.data", tmp_path / "node.bin"
    script = (f"import {{ readFile, writeFile }} from 'node:fs/promises';"
              f"import {{ int8Weights, readInt8Plan }} from '{RUNTIME / 'int8.js'}';"
              f"const plan = readInt8Plan(await readFile('{plan_path}'));"
              f"await writeFile('{out}', int8Weights(plan, await readFile('{data}')));")
    subprocess.run(["node", "--input-type=module", "-e", script], check=True, timeout=60)
    assert np.array_equal(np.fromfile(out, np.uint8), want)
    weight = want[:80 * n]  # then zeros to the next 64 bytes
    assert weight.min() >= 1 and weight.max() <= 255 and len(set(weight.tolist())) > 100  # -127..127 around 128


def test_int8_twin_reads_only_its_kept_ranges_of_the_shipped_file(tmp_path):
    """The twin names no int4 weight it replaced, and its plan's `keep` ranges are all of the shipped file it
    reads: with every other byte zeroed (what the page holds of the file on wasm once the uint8 weights are
    derived) it gives the same output."""
    from onnx import helper

    from webbuild.reference.transcribe import cpu_session

    src, _ = int4_projection(tmp_path)
    model = onnx.load(str(src))
    bias = np.random.default_rng(2).standard_normal(40).astype(np.float32)
    model.graph.node[0].output[0] = "mm"
    model.graph.node.append(helper.make_node("Add", ["mm", "bias"], ["y"]))
    model.graph.initializer.append(onnx.numpy_helper.from_array(bias, "bias"))
    (tmp_path / "g.onnx.data").unlink()
    onnx.save(model, str(src), save_as_external_data=True, location="g.onnx.data", size_threshold=0)
    twin = tmp_path / "w" / "g.wasm.onnx"
    twin.parent.mkdir()
    for f in ("g.onnx", "g.onnx.data"):
        (tmp_path / "w" / f).write_bytes((tmp_path / f).read_bytes())
    assert wasm_graph(tmp_path / "w" / "g.onnx", twin, form="int8")
    names = {t.name for t in onnx.load(str(twin), load_external_data=False).graph.initializer}
    assert "B" not in names and "S" not in names and "bias" in names
    plan = json.loads((twin.parent / "g.wasm.int8.json").read_text())
    data = np.fromfile(twin.parent / "g.onnx.data", np.uint8)
    assert plan["keep"] and sum(n for _, n in plan["keep"]) == bias.nbytes < data.size
    x = np.random.default_rng(1).standard_normal((1, 5, 96)).astype(np.float32)
    want = cpu_session(twin).run(None, {"x": x})[0]  # the uint8 weights derived from the whole file
    # as the page runs it: the derived file beside the twin, the shipped one zeroed outside `keep`
    (twin.parent / plan["file"]).write_bytes(int8_weights(plan, data).tobytes())
    sparse = np.zeros_like(data)
    for off, n in plan["keep"]:
        sparse[off:off + n] = data[off:off + n]
    sparse.tofile(twin.parent / "g.onnx.data")
    plain = ort.InferenceSession(str(twin), providers=["CPUExecutionProvider"])
    assert np.array_equal(plain.run(None, {"x": x})[0], want)


def test_the_page_runs_the_int8_twin_on_its_kept_ranges_as_on_the_whole_file(tmp_path):
    """onnxruntime-web's wasm EP (in Node, the site's own build) on the twin: with the shipped file reduced to its
    `keep` ranges (runtime/int8.js keptRanges, as the page hands it over) the output is the whole file's, bit for
    bit, and the Python reference's within float rounding."""
    from webbuild.reference.transcribe import cpu_session
    from webbuild.site.ort_files import ORT_FILES_DIR

    src, _ = int4_projection(tmp_path)
    model = onnx.load(str(src))
    model.graph.node[0].output[0] = "mm"
    model.graph.node.append(onnx.helper.make_node("Add", ["mm", "bias"], ["y"]))
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.arange(40, dtype=np.float32), "bias"))
    model.ir_version = 10  # what onnxruntime-web 1.30 reads (onnx's helper writes a newer one)
    (tmp_path / "g.onnx.data").unlink()
    onnx.save(model, str(src), save_as_external_data=True, location="g.onnx.data", size_threshold=0)
    twin = tmp_path / "g.wasm.onnx"
    assert wasm_graph(src, twin, form="int8")
    x = np.random.default_rng(1).standard_normal((1, 5, 96)).astype(np.float32)
    (tmp_path / "x.bin").write_bytes(x.tobytes())
    script = f"""
import {{ readFile, writeFile }} from 'node:fs/promises';
import * as ort from '{ORT_FILES_DIR / 'ort.webgpu.min.mjs'}';
import {{ int8Weights, keptRanges, readInt8Plan }} from '{RUNTIME / 'int8.js'}';
ort.env.wasm.numThreads = 1;
ort.env.wasm.wasmPaths = '{ORT_FILES_DIR}/';
const plan = readInt8Plan(await readFile('{tmp_path / 'g.wasm.int8.json'}'));
const data = new Uint8Array(await readFile('{tmp_path / 'g.onnx.data'}'));
const graph = new Uint8Array(await readFile('{twin}'));
const xs = await readFile('{tmp_path / 'x.bin'}');
const floats = new Float32Array(xs.buffer.slice(xs.byteOffset, xs.byteOffset + xs.length));
const x = new ort.Tensor('float32', floats, [1, 5, 96]);
const run = async (weights) => {{
  const s = await ort.InferenceSession.create(graph, {{ executionProviders: ['wasm'],
    externalData: [{{ path: plan.source, data: weights }}, {{ path: plan.file, data: int8Weights(plan, data) }}] }});
  return (await s.run({{ x }})).y.data;
}};
const whole = await run(data), kept = await run(keptRanges(data, plan.keep));
await writeFile('{tmp_path / 'whole.bin'}', whole);
await writeFile('{tmp_path / 'kept.bin'}', kept);
"""
    # --liftoff-only: V8 would otherwise optimise all of onnxruntime-web's 26 MB of wasm before Node exits (29 s here)
    subprocess.run(["node", "--liftoff-only", "--input-type=module", "-e", script], check=True, timeout=120)
    whole, kept = (np.fromfile(tmp_path / f"{n}.bin", np.float32) for n in ("whole", "kept"))
    assert np.array_equal(whole, kept)
    want = cpu_session(twin).run(None, {"x": x})[0].ravel()
    assert np.allclose(kept, want, rtol=1e-4, atol=1e-4), np.abs(kept - want).max()

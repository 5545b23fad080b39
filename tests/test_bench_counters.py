"""WebGPU call counters in `webbuild bench` (webbuild/tools/bench/counters.mjs), on SwiftShader through
Dawn in Node: the tiny example's counts per decode token are reported, identical between two runs,
and follow from the graph and onnxruntime-web's fusions at the MatMulNBits accuracy level the site ships
(`quantize.webgpu_accuracy_level`, 0 by default since issue 14).

The level's kernels: onnxruntime-web 1.30 takes its two-dispatch DP4A path (DP4AMatMulQuantize +
DP4AMatMulNBits) for accuracy level 4 only on a device with the `subgroups` feature, and only when that path
is not taken does it fuse the decode-time MatMulNBits (norm + Q, K, V into MatMulNBitsQkvDecode, gate + up +
SiLU*mul into MatMulNBitsMlpDecode). Level 0, the default, takes the fused kernels on every device: 4 a
layer + lm_head. (On a GPU with subgroups, the H200 of issue 14, level 4 was 2 dispatches per MatMulNBits,
7 a layer + lm_head, unfused: BENCHMARKS.md. SwiftShader, which the site's runtime gives a device without
`subgroups` (runtime/probe.js), counted both levels alike; the level reaching the WebGPU graph is
tests/test_decoder_forms.py's.)

LoRA adapters (docs/adapters.md): with none on, the example (which ships one) counts per token exactly as
its build without adapters (the base sessions decode); switching one on writes its values into the adapted
sessions' inputs made at load, creating no GPU buffer, and the captured decode replays with it."""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections import Counter
from pathlib import Path

import onnx
import pytest

from tests.conftest import BENCH_DECODE as DECODE
from tests.conftest import ONE_CLIP_RUN, decode_forms
from webbuild.adapters import DOWN_GROUPS
from webbuild.site.adapter_pack import stored_parameters
from webbuild.tools.bench import HARNESSES, SWIFTSHADER_ENV, node_args

# Counted as (4-token decode - 1-token decode) / 3. The example as is runs one sample clip, so that the
# captured and the plain decode compare transcripts; the tests (and test_bench_timing.py) share its runs
# (webgpu_bench); the browser's run too, as the pool of buffers a clip leaves counts in `buffers`. The other
# runs count without one. The captured run is the one test_prefill_runs.py reads (its warm-up of the shape
# classes), and holds the plain steps' figures too (--decode-forms both); the others warm up on a second of silence.
CLIP, NO_CLIP = ("--max-clips", "1"), ("--max-clips", "0")
CAPTURED = ONE_CLIP_RUN


@pytest.fixture(scope="module")
def level0(example_dist) -> Path:
    """The example as is (WebGPU decoder at accuracy level 0, the default)."""
    return example_dist


def benched(webgpu_bench, site: Path, *options: str) -> dict:
    """The report of `webbuild bench --ep webgpu` on SwiftShader (Node + Dawn, or `--runtime browser`), its
    terminal table checked."""
    report, stdout = webgpu_bench(site, *options)
    assert "dispatches" in stdout and "kernels" in stdout  # the terminal table shows them
    return report


def counted(webgpu_bench, site: Path, *options: str) -> dict:
    """counters_per_token of benched()."""
    return benched(webgpu_bench, site, *options)["counters_per_token"]


def decoder_graph(site: Path, name: str = "decoder.fp32.onnx") -> onnx.ModelProto:
    """The fp32 WebGPU decoder graph (or its step form), put back together from its shards."""
    shards = sorted((site / "model" / "shards").glob(f"{name}.0*.bin"))
    return onnx.load_from_string(b"".join(p.read_bytes() for p in shards))


def test_counts_are_reported(level0, webgpu_bench):
    """Decode steps replay the captured step graph (runtime/capture.js): no bind group and no uniform
    write of onnxruntime-web's per token, only the runtime's mask position (8 bytes): the token comes from
    the previous step's choice on the GPU, and 12 bytes of it (token, margin) come back. (That two runs
    count the same: test_adapter_off_counts_as_no_adapters_and_switching_creates_no_buffer.)"""
    ra = benched(webgpu_bench, level0, *CAPTURED)
    a = ra["counters_per_token"]
    assert ra["decode"] == "captured", ra["decode"]
    assert a["decode_tokens"] == [1, DECODE]
    # one read-back (the logits) per token; every dispatch is named by the program that issued it
    assert a["readbacks"] == 1 and a["submits"] >= 1 and a["write_buffers"] >= 1 and a["write_bytes"] > 0
    assert a["dispatches"] == sum(a["kernels"].values()) and a["dispatches"] > 0
    assert "(no pipeline)" not in a["kernels"] and "(unnamed)" not in a["kernels"]
    assert a["bind_groups"] == 0 and a["write_buffers"] == 1 and a["write_bytes"] == 8


def test_captured_decode_gives_the_plain_decodes_tokens(level0, webgpu_bench):
    """Plain steps (--decode-forms both's second form, as --no-graph-capture decodes): every step a plain run of the
    decoder (a bind group and a uniform write per dispatch), the token chosen in JS; the same greedy tokens and
    margins, and the same transcript of the sample clip, either way. Both run the same projections; the plain
    decoder's attention is GroupQueryAttention, the captured step's is written out over the static cache
    (fusion.step_attention: direct, the default: the step's K and V rows written in place by ScatterND, q's and k's
    rotary embedding, the scores' MatMul, Softmax and the values' MatMul), every kernel dispatched directly, and it
    makes the greedy choice on the GPU (the logits padded to rows of 128, the vocabulary of 1,031 being no multiple:
    Pad, then two ReduceMin for the token's index) without the last-position Slice."""
    forms = decode_forms(*webgpu_bench(level0, *CAPTURED))
    for _, table in forms.values():  # each form's part of the table shows its counts
        assert "dispatches" in table and "kernels" in table
    (captured, _), (plain, _) = forms["captured"], forms["plain"]
    assert captured["decode"] == "captured" and plain["decode"].startswith("plain")
    ids = [r["synthetic_decode"]["token_ids"] for r in (captured, plain)]
    assert ids[0] == ids[1] and len(ids[0]) == DECODE + 1
    assert captured["clips"][0]["text"] == plain["clips"][0]["text"]
    c, p = captured["counters_per_token"], plain["counters_per_token"]
    assert p["bind_groups"] == p["dispatches"] == p["write_buffers"] > 0
    margins = [r["synthetic_decode"]["margins"] for r in (captured, plain)]
    assert len(margins[0]) == len(ids[0]) and margins[0] == pytest.approx(margins[1], abs=1e-4)
    k, q = c["kernels"], p["kernels"]
    shared = ("GatherBlockQuantized", "MatMulNBits", "MatMulNBitsQkvDecode", "MatMulNBitsMlpDecode", "SkipLayerNorm")
    assert {n: k.get(n) for n in shared} == {n: q.get(n) for n in shared}
    layers = sum(n.op_type == "GroupQueryAttention" for n in decoder_graph(level0).graph.node)
    assert q["FlashAttentionDecodeQKV"] == layers > 0 and not any(n.startswith("FlashAttention") for n in k)
    per_layer = {"ScatterND": 2, "RotaryEmbedding": 2, "MatMul": 2, "Softmax": 1}
    assert {n: k.get(n, 0) for n in per_layer} == {n: m * layers for n, m in per_layer.items()}
    assert (k["Pad"], k["ReduceMin"], k.get("Slice", 0)) == (1, 2, 0) and q["Slice"] == 1
    # no kernel takes its sizes from the GPU (dispatchWorkgroupsIndirect, which Chromium validates at 0.4 ms or
    # more each: docs/graph-capture.md), captured or plain
    assert c["indirect"] == p["indirect"] == 0


def test_decode_forms_both_reports_each_forms_figures_from_one_load(level0, webgpu_bench):
    """--decode-forms both: one load's clip and synthetic decode in the captured form (the report's own keys, as
    without the option) and then in plain steps (its `plain`: the same keys and the form's `decode`), each form in
    a part of the table of its own; both decode the same tokens."""
    report, stdout = webgpu_bench(level0, *CAPTURED)
    figures = {"clips", "summary", "synthetic_decode", "counters_per_token", "timing_per_token"}
    plain = report["plain"]
    assert set(plain) == figures | {"decode"} and figures <= set(report)
    assert report["decode"] == "captured" and plain["decode"] == "plain (--decode-forms both)"
    def tokens(form: dict) -> tuple[list[int], list[list[int]]]:  # the synthetic decode's, the clip's
        return form["synthetic_decode"]["token_ids"], [c["token_ids"] for c in form["clips"]]

    assert tokens(plain) == tokens(report) and all(tokens(report)) and all(tokens(report)[1])
    forms = decode_forms(report, stdout)
    (_, captured_table), (_, plain_table) = forms["captured"], forms["plain"]
    assert "queued ahead" in captured_table and "read-back wait" not in captured_table  # the captured steps' phases
    assert "read-back wait" in plain_table and "queued ahead" not in plain_table  # the plain steps' phases
    for table in (captured_table, plain_table):  # each form's figures once in its part
        assert sum(line.startswith(("decode ", "per token ", "time/token ")) for line in table.splitlines()) == 3


def test_the_step_form_has_no_audio_inputs_and_no_shape_arithmetic(level0):
    step = decoder_graph(level0, "decoder.fp32.step.onnx")
    full = decoder_graph(level0)
    inputs = [i.name for i in step.graph.input]
    assert [i.name for i in full.graph.input if i.name not in ("audio_features", "audio_offset")] == inputs
    outputs = [o.name for o in full.graph.output]
    assert [o.name for o in step.graph.output] == [n for n in outputs if n != "logits"] + ["next_token", "margin"]
    # next_token is written into input_ids' buffer: the same type and shape
    ids, token = step.graph.input[0], step.graph.output[-2]
    assert ids.name == "input_ids" and ids.type == token.type
    assert ids.type.tensor_type.elem_type == onnx.TensorProto.INT32
    ops = Counter(n.op_type for n in step.graph.node)
    assert "Shape" not in ops, ops
    consts = {i.name for i in step.graph.initializer}
    assert all(set(n.input) <= consts for n in step.graph.node if n.op_type == "Range")  # the index: folded
    # the attention written out (fusion.step_attention: direct): each layer's K and V rows written in place
    assert "GroupQueryAttention" not in ops
    assert ops["ScatterND"] == 2 * Counter(n.op_type for n in full.graph.node)["GroupQueryAttention"] > 0
    # the weights are the decoder's own file: the step form is a few KB
    assert {e.value for t in step.graph.initializer for e in t.external_data if e.key == "location"} == \
        {"decoder.fp32.onnx.data"}


def test_level_0_counts_follow_the_graph_and_the_fusions(level0, webgpu_bench):
    graph = decoder_graph(level0)
    c = counted(webgpu_bench, level0, *CAPTURED)
    ops = Counter(n.op_type for n in graph.graph.node)
    layers = ops["GroupQueryAttention"]
    assert ops["MatMulNBits"] == 7 * layers + 1  # q, k, v, o, gate, up, down per layer, and lm_head
    assert {a.i for n in graph.graph.node if n.op_type == "MatMulNBits" for a in n.attribute
            if a.name == "accuracy_level"} == {0}
    assert not any(k.startswith("DP4A") for k in c["kernels"]), c["kernels"]
    assert c["kernels"]["MatMulNBitsQkvDecode"] == layers  # q, k, v (and the norm before them)
    assert c["kernels"]["MatMulNBitsMlpDecode"] == layers  # gate, up (and SiLU * up)
    assert c["kernels"]["MatMulNBits"] == 2 * layers + 1  # o, down, lm_head


@pytest.mark.browser
def test_the_browser_counts_as_node_does_but_for_one_norm_chromium_limits_keep_unfused(level0, webgpu_bench):
    """`--runtime browser`: the site's worker in Chromium (a bench-only copy with counters.mjs and
    synth_hook.js) counts the same calls as the Node bench, both onnxruntime-web 1.30 on SwiftShader with
    runtime/probe.js's device (the adapter's features less subgroups, all its limits), except one.
    Chromium reports SwiftShader's adapter with its own limit tiers: 10 storage buffers per shader stage
    where Dawn in Node reports 12, and onnxruntime-web then leaves one normalisation out of its fused
    MatMulNBits decode kernels: one LayerNorm dispatch more per token (its bind group and its uniforms'
    writeBuffer with it, in a plain run; in the captured decode both are recorded). Capping Node's device at
    Chromium's limits gives the browser's counts exactly."""
    browser, node = (counted(webgpu_bench, level0, *CLIP, "--runtime", "browser"),
                     counted(webgpu_bench, level0, *CAPTURED))
    assert browser["decode_tokens"] == node["decode_tokens"] == [1, DECODE]
    assert browser["readbacks"] == 1 and browser["dispatches"] > 0
    assert browser["dispatches"] == sum(browser["kernels"].values())
    assert "(no pipeline)" not in browser["kernels"] and "(unnamed)" not in browser["kernels"]
    for k in ("submits", "readbacks", "bind_groups", "write_buffers"):
        assert browser[k] == node[k], k  # captured decode: no bind group or uniform write per dispatch
    # buffers: no captured step makes one; the first (short) decode's prompt fills onnxruntime-web's buffer pool,
    # by as much as the warm-up left it wanting, which differs between the two runtimes' sessions
    assert browser["buffers"] <= 0 and node["buffers"] <= 0
    assert browser["dispatches"] == node["dispatches"] + 1
    extra = {k: v - node["kernels"].get(k, 0) for k, v in browser["kernels"].items() if v != node["kernels"].get(k, 0)}
    assert extra == {"LayerNorm": 1} and set(node["kernels"]) <= set(browser["kernels"])


def test_adapter_off_counts_as_no_adapters_and_switching_creates_no_buffer(level0, example_dist_without_adapters,
                                                                           webgpu_bench):
    """Off: the same calls per token as the build without adapters, another process (so two runs count the
    same) on another build whose base decoder is the same graph. `--adapter klatt` switches it on, off and
    on again: each switch on is one writeBuffer per lora.* input (float32 values: 4 bytes each, of the rows its
    file stores), two per down for the step form's codes and scales (lora.quantized_downs; q/k/v's 4-bit),
    four per joined group (lora.joint_downs: the down's rows of the joint weights and scales, the whole 8-bit
    up and its scales) and one per layer for its packed q/k/v up (all its values), then the delta graph run once
    per layer (lora.merged_deltas: gate's and up's merged updates, computed into the step's buffers): its
    dispatches, a multiple of the layers, each with its bind group and its uniforms' writeBuffer, and no read-back,
    GPU buffer or pipeline (all made at load). With it on the decode replays the adapted step graph (still no
    bind group and one 8-byte mask write per token): a Gemm more for q/k/v at once (the 2-D form's up MatMul and
    Add, fused by onnxruntime-web: docs/adapters.md, so no Add), an 8-bit MatMulNBits adding o's and down's updates
    to the joint MatMulNBits that replaces each projection (no down of their own), a fused norm + Q/K/V kernel for
    gate/up's copy of the norm with their merged updates (spare_readers; no MatMul left), and a Split after the
    layer's fused norm + Q/K/V kernel, which now computes q, k and v packed and their 4-bit down
    (lora.packed_updates); the base's fused norm + gate/up + SiLU kernel stays."""
    off = benched(webgpu_bench, level0, *CAPTURED)
    without = benched(webgpu_bench, example_dist_without_adapters, *NO_CLIP)
    on = benched(webgpu_bench, level0, *NO_CLIP, "--adapter", "klatt")
    assert off["lora"] is None and off["decode"] == without["decode"] == on["decode"] == "captured"
    # buffers per token are no decode step's (a captured step makes none) but the first decode's prompt
    # filling onnxruntime-web's buffer pool, which the sessions of a device share: none or fewer in both builds,
    # by how much depends on what the warm-up (the shape classes' here, a second of silence there) and the
    # adapted sessions' left in the pool; pipelines likewise the first decode's compiles of the prompt's shapes,
    # which the build without adapters meets there, its run having no clip before it
    first_decode = ("buffers", "buffer_bytes", "pipelines")
    assert {k: v for k, v in off["counters_per_token"].items() if k not in first_decode} == {
        k: v for k, v in without["counters_per_token"].items() if k not in first_decode}
    for run in (off, without):
        assert run["counters_per_token"]["buffers"] <= 0 and run["counters_per_token"]["pipelines"] <= 0
    manifest = json.loads((level0 / "model" / "manifest.json").read_text())
    tensors, layout = manifest["adapters"]["klatt"]["tensors"], manifest["variants"][on["variant"]]["lora_layout"]
    values = stored_parameters(tensors)  # only the rows a file stores are written (the ups' own rows)
    assert values < sum(t["shape"][0] * t["shape"][1] for t in tensors.values())
    assert [s["to"] for s in on["lora_switches"]] == ["klatt", None, "klatt"]
    layers = len({r["delta"]["run"] for r in layout.values() if r["kind"] == "delta"})
    assert layers == sum(n.endswith(".down") for n in tensors) // len(DOWN_GROUPS)
    # what a switch writes of the step's inputs (runtime/lora-encode.js): each whole, a joint's rows after its base;
    # not the adapted graph's own tensors (kind float) nor the merged updates (made by the delta graph)
    written = {n: r for n, r in layout.items() if r["kind"] not in ("float", "delta")}
    size = 2 if manifest["variants"][on["variant"]]["dtype"] == "float16" else 4
    step_bytes = sum(math.prod(r["dims"]) * (1 if r["part"] == "codes" else size)
                     * (r["dims"][0] - r.get("rows", 0) if r["kind"] == "joint_down" else r["dims"][0]) // r["dims"][0]
                     for r in written.values())
    for s in on["lora_switches"]:
        c = s["counts"]
        if not s["to"]:
            assert set(c.values()) == {0}, s
            continue
        runs = c["dispatches"]  # the delta graph's, one run a layer: a dispatch, a bind group, a uniforms write each
        assert runs > 0 and runs % layers == 0 and c["bind_groups"] == runs and c["submits"] % layers == 0, s
        assert c["write_buffers"] == len(tensors) + len(written) + runs, s
        uniforms = c["write_bytes"] - 4 * values - step_bytes
        assert 0 < uniforms <= 64 * runs and uniforms % layers == 0, s
        assert {k: c[k] for k in ("readbacks", "buffers", "buffer_bytes", "pipelines")} == dict.fromkeys(
            ("readbacks", "buffers", "buffer_bytes", "pipelines"), 0), s
    assert on["lora_switches"][0]["counts"] == on["lora_switches"][2]["counts"]
    c, base = on["counters_per_token"], off["counters_per_token"]
    assert c["bind_groups"] == 0 and c["write_buffers"] == 1 and c["write_bytes"] == 8 and c["readbacks"] == 1
    ups, downs = (sum(n.endswith(part) for n in tensors) for part in (".up", ".down"))
    assert (ups, downs) == (28, 16)  # q/k/v share one down a layer, gate/up another (webbuild.adapters.DOWN_GROUPS)
    biases = sum(n.endswith((".gate_proj.up", ".up_proj.up")) for n in tensors)  # the step's MLP updates, merged
    kinds = ("MatMul", "MatMulNBits", "Gemm", "Add", "Split", "MatMulNBitsQkvDecode", "SkipLayerNorm")
    added = {k: c["kernels"].get(k, 0) - base["kernels"].get(k, 0) for k in kinds}
    # o's and down's updates: an 8-bit MatMulNBits each, their projection joined to the down (lora.joint_downs);
    # q/k/v's down inside the fused kernel with them packed, gate/up's merged updates in one of its own with its copy
    # of the norm (lora.merged_deltas, spare_readers)
    joints = sum(r["kind"] == "joint_up" and r["part"] == "codes" for r in layout.values())
    packed = sum(len(r["from"]) for r in layout.values() if r["kind"] == "packed_up")  # q/k/v's ups, one Gemm
    assert joints == 2 * layers and packed == 3 * layers  # o's and down's groups (contract.JOINT_DOWNS), q/k/v's
    gemms = ups - biases - packed + layers - joints
    assert added == {"MatMul": 0, "MatMulNBits": joints, "Gemm": gemms,
                     "Add": 0, "Split": layers, "MatMulNBitsQkvDecode": layers, "SkipLayerNorm": 0}, c["kernels"]
    # gate/up's branch reads a copy of the norm, so onnxruntime-web still fuses norm + gate/up + SiLU
    assert c["kernels"]["MatMulNBitsMlpDecode"] == base["kernels"]["MatMulNBitsMlpDecode"] > 0, c["kernels"]


@pytest.mark.webgpu
@pytest.mark.slow
def test_the_adapted_sessions_loaded_or_released_leave_the_base_decode_as_it_is(level0):
    """webbuild/tools/bench/adapted_ab.mjs (the H200 question of docs/adapters.md, asked in one process):
    the example's base decode with its adapted sessions loaded and with them released makes the same
    WebGPU calls per token, captured both ways; releasing and re-creating them works round after round."""
    env = {**os.environ, **SWIFTSHADER_ENV}
    ab = [str(HARNESSES / "adapted_ab.mjs"), str(level0), "--rounds", "2", "--decode-tokens", "2", "--warm-tokens", "1"]
    run = subprocess.run(["node", *node_args(), *ab], capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stderr
    r = json.loads(run.stdout)
    assert [(p["round"], p["arm"]) for p in r["phases"]] == [(0, "with"), (0, "without"), (1, "without"), (1, "with")]
    assert {p["decode"] for p in r["phases"]} == {"captured"}
    assert len({p["calls_per_token"] for p in r["phases"]}) == 1 and r["phases"][0]["calls_per_token"] > 0
    assert r["with"]["median_ms"] > 0 and r["without"]["median_ms"] > 0

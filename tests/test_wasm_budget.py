"""The wasm plan (webbuild/pipeline/wasm_budget.py): on the tiny example every graph's twin fits, and the
estimate is within a factor of the heap a real onnxruntime-web wasm session grows to in Node; the same
plan from the dimensions alone agrees with the graphs'; the int8 form's estimate (the uint8 weights, twice
the int4 codes, in the heap once); the 0.6b runs int8 and the 1.7b's decoder keeps its MatMulNBits,
where every option with a float twin is past 4 GiB, and a budget below every option leaves no choice;
under a budget too small for the twins (and for an 8-bit decoder, which no twin folds) the build ships the
graphs with their MatMulNBits and the site's wasm path (Node) transcribes the samples token for token as
the Python reference; under a budget too
small for anything the build refuses the wasm path in its report and manifest, and `webbuild verify`
(real Chromium, WebGPU hidden) sees the page say the model needs WebGPU."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import onnx
import pytest

from tests.command import webbuild
from tests.example_config import EXAMPLE, example_config, write_example_config
from webbuild.pipeline.wasm_budget import BUDGET, BUDGET_ENV, GIB, TAB_ALLOWANCE, form_parts, shapes_need
from webbuild.reference.audio import read_wav
from webbuild.reference.transcribe import load_transcriber
from webbuild.site.manifest import load_manifest, reassemble
from webbuild.tools.bench import run_node

FOLDED = {"encoder": "float", "decoder": "float"}
INT8 = {"encoder": "int8", "decoder": "int8"}


def build(out: Path, budget: int | None = None, config: Path | None = None) -> subprocess.CompletedProcess:
    """The example built into `out` under `budget`; by default without its adapter, whose forms the wasm plan
    does not weigh (a build of the check lane's minutes saved)."""
    if config is None:
        config = write_example_config(out.parent, adapters=[])
    env = dict(os.environ, **({BUDGET_ENV: str(budget)} if budget else {}))
    run = webbuild(config, "-o", out, env=env)
    assert run.returncode == 0, run.stderr
    return run


@pytest.fixture(scope="module")
def dist(example_build):
    return example_build.dist, example_build


def preset_need(name: str, max_positions: int, decoder_sessions: int = 1) -> dict:
    """The plan from a zoo preset's dimensions (webbuild.zoo needs the zoo extra: tests calling this are
    marked torch)."""
    from webbuild.zoo.presets import get_preset

    p = get_preset(name)
    t, a = p.text, p.audio
    return shapes_need(layers=t["num_hidden_layers"], hidden=t["hidden_size"], intermediate=t["intermediate_size"],
                       heads=t["num_attention_heads"], kv_heads=t["num_key_value_heads"], head_dim=t["head_dim"],
                       vocab=151_936 if p.qwen_ids else p.bpe_vocab_size, enc_layers=a["encoder_layers"],
                       enc_dim=a["d_model"], enc_ffn=a["encoder_ffn_dim"], max_positions=max_positions,
                       decoder_sessions=decoder_sessions)


def wasm_plan(out: Path) -> dict:
    return json.loads((out / "build-report.json").read_text())["variants"]["fp32"]["wasm"]


def test_the_int8_form_holds_its_uint8_weights_once_in_place_of_the_int4_ones():
    k, n = 1024, 3072
    int4 = k * n // 2 + k * n // 32 * 4  # codes and a float32 scale per 32
    forms = form_parts(int4 + 1000, int4 + 100, [4 * k * n], int8=[(k * n, int4 - 4 * n)])
    int8, kept = forms["int8"], forms["matmul_nbits"]
    assert int8["tensor_bytes"] == 100 + k * n + 4 * n  # uint8 weight and column scales; no int4 codes
    assert int8["int8_bytes"] == k * n == 2 * (k * n // 2)  # twice the int4 codes, derived: no second download
    assert int8["model_bytes"] == int4 + 1000 + k * n  # the derived file beside the shipped one, at creation only
    assert int8["folded_bytes"] == int8["scratch_bytes"] == int8["slow_bytes"] == 0
    assert kept["slow_bytes"] == kept["scratch_bytes"] == 4 * k * n and forms["float"]["folded_bytes"] == 14 * 4 * k * n


def test_the_tiny_example_fits_within_a_factor_of_its_measured_wasm_heap(dist):
    out, run = dist
    fit = wasm_plan(out)
    manifest = json.loads((out / "model" / "manifest.json").read_text())
    assert manifest["variants"]["fp32"]["wasm"] == {k: fit[k] for k in ("need_bytes", "budget_bytes", "fits",
                                                                          "tab_bytes")}
    # the tab: the heap's need, the largest session's model bytes in JavaScript beside it, and the renderer's own
    assert fit["tab_bytes"] == fit["need_bytes"] + fit["model_bytes"] + TAB_ALLOWANCE
    assert fit["fits"] and fit["budget_bytes"] == BUDGET and "why" not in fit
    # every option fits: of the fast ones (no MatMulNBits left) the float twins are the fastest; every option listed
    assert fit["forms"] == FOLDED and fit["folded_bytes"] > 0 and fit["slow_bytes"] == fit["int8_bytes"] == 0
    assert len(fit["options"]) == 9 and all(o["fits"] for o in fit["options"])
    roles = set(manifest["variants"]["fp32"])
    assert {"encoder_wasm", "decoder_wasm"} <= roles and not {"encoder_wasm_int8", "decoder_wasm_int8"} & roles
    assert "fp32: wasm fallback needs about" in run.stderr and "encoder float, decoder float;" in run.stderr
    heap = run_node(out, "wasm", decode_tokens=8, max_clips=1, timeout=600)["wasm_heap_bytes"]["peak"]
    print(f"tiny: wasm estimate {fit['need_bytes'] / 2**20:.0f} MiB, measured heap {heap / 2**20:.0f} MiB")
    # generous, but not wildly: measured 207 MiB
    assert heap <= fit["need_bytes"] <= 4 * heap, (heap, fit)


@pytest.mark.torch
def test_the_estimate_from_dimensions_agrees_with_the_graphs(dist):
    out, _ = dist
    fit = json.loads((out / "build-report.json").read_text())["variants"]["fp32"]["wasm"]
    shapes = preset_need("tiny", fit["max_positions"], decoder_sessions=2)  # the example ships an adapter
    assert shapes["kv_cache_bytes"] == fit["kv_cache_bytes"]
    assert 0.8 <= shapes["folded_bytes"] / fit["folded_bytes"] <= 1.25, (shapes, fit)
    assert 0.8 <= shapes["need_bytes"] / fit["need_bytes"] <= 1.25, (shapes, fit)


@pytest.mark.torch
def test_the_0_6b_runs_int8_and_the_1_7b_keeps_its_decoder_matmul_nbits(dist):
    out, _ = dist
    positions = wasm_plan(out)["max_positions"]
    plans = {name: preset_need(name, positions) for name in ("0.6b", "1.7b")}
    for name, need in plans.items():
        print(f"{name} wasm plan: {need['need_bytes'] / GIB:.2f} GiB at {need['peak']}",
              [(o["forms"], round(o["need_bytes"] / GIB, 2)) for o in need["options"]])
        # a float twin (0.6b encoder: float32 0.69 GB, folded) is past 4 GiB: every option with one is out
        assert all(o["need_bytes"] > 4 * GIB for o in need["options"] if "float" in o["forms"].values())
    six = plans["0.6b"]  # the uint8 weights (0.72 GiB) derived at load, nothing left to MatMulNBits
    assert six["fits"] and six["forms"] == INT8 and six["slow_bytes"] == six["scratch_bytes"] == 0
    assert 0.7 * GIB < six["int8_bytes"] < 0.75 * GIB and six["need_bytes"] < 2 * GIB
    big = plans["1.7b"]  # its int8 decoder would need 4.85 GiB: the decoder keeps MatMulNBits, the encoder int8
    assert big["fits"] and big["forms"] == {"encoder": "int8", "decoder": "matmul_nbits"}
    assert all(not o["fits"] for o in big["options"] if o["forms"]["decoder"] == "int8")


@pytest.mark.torch
def test_a_budget_below_every_option_leaves_no_wasm_path(dist, monkeypatch):
    out, _ = dist
    monkeypatch.setenv(BUDGET_ENV, str(GIB))
    need = preset_need("0.6b", wasm_plan(out)["max_positions"])
    assert not need["fits"] and not any(o["fits"] for o in need["options"])
    assert need["need_bytes"] == min(o["need_bytes"] for o in need["options"])
    assert need["why"] == f"its WebAssembly fallback needs {need['need_bytes'] / GIB:.1f} GiB, more than the 1.0 GiB " \
                          "a browser tab gets"


def test_twins_over_budget_give_way_to_matmul_nbits_and_wasm_transcribes_as_the_reference(dist, tmp_path):
    out, _ = dist
    options = wasm_plan(out)["options"]
    # the smallest option keeps a graph's MatMulNBits (which of the two depends on the model: a large vocabulary's
    # float lookup can outweigh the int8 twin's savings)
    kept = min(options, key=lambda o: o["need_bytes"])
    assert "matmul_nbits" in kept["forms"].values() and kept["forms"] != INT8
    assert all(o["need_bytes"] > kept["need_bytes"] for o in options if o is not kept)
    small = tmp_path / "dist"
    # room for that option only (of the adapted example's plan, whose options the adapter's forms weigh into)
    run = build(small, budget=kept["need_bytes"], config=EXAMPLE / "model.yaml")
    fit = wasm_plan(small)
    assert fit["fits"] and fit["forms"] == kept["forms"] and fit["need_bytes"] == kept["need_bytes"]
    assert [o["fits"] for o in fit["options"]] == [o is kept for o in options]
    assert f"encoder {kept['forms']['encoder']}, decoder {kept['forms']['decoder']};" in run.stderr
    entry = json.loads((small / "model" / "manifest.json").read_text())["variants"]["fp32"]
    assert entry["wasm"]["fits"]
    for graph, role in (("encoder", "encoder_wasm"), ("decoder", "decoder_wasm")):
        if kept["forms"][graph] != "matmul_nbits":
            continue
        assert graph == "decoder" or role not in entry  # the int4 encoder itself runs on wasm
        if role in entry:  # a decoder twin: only the lookup wasm lacks is rewritten
            reassemble(small / "model", load_manifest(small / "model"), entry[role], tmp_path / "twin.onnx")
            ops = {n.op_type for n in onnx.load(str(tmp_path / "twin.onnx"), load_external_data=False).graph.node}
            assert "MatMulNBits" in ops and "GatherBlockQuantized" not in ops
    wasm_transcribes_as_the_reference(small, max_clips=1)


def test_under_a_budget_too_small_for_float_twins_the_int8_twins_ship_and_wasm_transcribes_as_the_reference(
        dist, tmp_path):
    out, _ = dist
    int8 = next(o for o in wasm_plan(out)["options"] if o["forms"] == INT8)
    small = tmp_path / "dist"
    run = build(small, budget=int8["need_bytes"])  # no float twin fits: the int8 ones leave no MatMulNBits
    fit = wasm_plan(small)
    assert fit["forms"] == INT8 and fit["int8_bytes"] > 0 and fit["slow_bytes"] == fit["folded_bytes"] == 0
    assert "GiB of int8 weights derived at load from the int4 ones, nothing more to download;" in run.stderr
    entry = json.loads((small / "model" / "manifest.json").read_text())["variants"]["fp32"]
    files = json.loads((small / "build-report.json").read_text())["variants"]["fp32"]["files"]
    # the plans are all the wasm path adds beside its twins: no uint8 weights are shipped
    assert {"encoder_wasm_int8", "decoder_wasm_int8"} <= set(entry)
    assert all(files[entry[role]] < 64 << 10 for role in ("encoder_wasm_int8", "decoder_wasm_int8"))
    assert not [name for name in files if name.endswith(".int8.bin")]
    bench = wasm_transcribes_as_the_reference(small, max_clips=1)
    assert 0 < bench["load"]["int8_ms"] < bench["load"]["session_ms"]  # the page derived them, and says how long


def test_an_8_bit_build_keeps_its_decoder_matmul_nbits_and_wasm_transcribes_as_the_reference(tmp_path):
    write_example_config(tmp_path, quantize={"bits": 8}, adapters=[])
    out = tmp_path / "dist"
    run = webbuild(tmp_path / "model.yaml", "-o", out)
    assert run.returncode == 0, run.stderr
    fit = wasm_plan(out)
    # the twins take 4-bit weights only: the int4 encoder folds, the 8-bit decoder keeps its MatMulNBits
    assert fit["fits"] and fit["forms"] == {"encoder": "float", "decoder": "matmul_nbits"}
    assert [o["forms"]["decoder"] for o in fit["options"]] == ["matmul_nbits"] * 3
    wasm_transcribes_as_the_reference(out, max_clips=1)


def wasm_transcribes_as_the_reference(site: Path, max_clips: int) -> dict:
    """The site's sample clips on its wasm path in Node: the Python reference's tokens and the expected text;
    the bench's result."""
    bench = run_node(site, "wasm", decode_tokens=4, max_clips=max_clips, timeout=600)
    assert bench["ep"] == "wasm" and len(bench["clips"]) == max_clips
    reference = load_transcriber(site, ep="wasm")  # the graphs the wasm EP runs, as the page derives them
    for clip in bench["clips"]:
        want = reference.generate(read_wav(site / clip["src"]))
        assert clip["token_ids"] == want, clip["src"]
        assert clip["text"] == reference.transcribe(read_wav(site / clip["src"])) == clip["expected"]
    return bench


@pytest.mark.slow
@pytest.mark.browser
def test_a_build_over_budget_refuses_wasm_and_verify_sees_the_page_say_so(tmp_path):
    # one sample and no adapter: verify transcribes it once on SwiftShader WebGPU (the example's four, three
    # times with its adapter, take minutes here) before the visit that matters
    site = example_config()["site"]
    out = tmp_path / "dist"
    run = build(out, budget=64 << 20, config=write_example_config(
        tmp_path, adapters=[], site={**site, "samples": site["samples"][:1]}))
    fit = json.loads((out / "build-report.json").read_text())["variants"]["fp32"]["wasm"]
    need = f"{fit['need_bytes'] / GIB:.1f} GiB"
    assert f"fp32: no wasm fallback: needs {need} of the 0.1 GiB a wasm page gets; visitors without WebGPU " \
           "are told the model needs WebGPU" in run.stderr
    assert not fit["fits"] and fit["budget_bytes"] == 64 << 20 and fit["need_bytes"] > fit["budget_bytes"]
    assert json.loads((out / "model" / "manifest.json").read_text())["variants"]["fp32"]["wasm"]["fits"] is False
    # first visits on WebGPU (SwiftShader, forced), then the visit with WebGPU hidden expects the refusal
    report_path = tmp_path / "report.json"
    verify = webbuild("verify", out, "--ep", "webgpu", "--live", "off", "--json", report_path)  # live: test_live's
    report = json.loads(report_path.read_text())
    checks = {c["name"]: c for c in report["checks"]}
    said = checks["WebGPU off: the page says the model needs WebGPU"]
    assert said["ok"], said
    assert f"This model needs WebGPU: its WebAssembly fallback needs {need}, more than the 0.1 GiB a browser tab " \
           "gets." in said["detail"]
    assert "WebGPU off: model loads" not in checks and "wasm fallback transcribes" not in checks
    assert verify.returncode == 0, verify.stdout + verify.stderr

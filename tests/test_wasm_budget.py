"""The wasm memory estimate (webbuild/build/wasm_budget.py) on the tiny example: it fits, and its figure is
within a factor of the heap a real onnxruntime-web wasm session grows to in Node; the same estimate from
the dimensions alone agrees with the graphs'; the 0.6b's does not fit; and a build under a forced-small
budget refuses the wasm path in its report and manifest, and `webbuild verify` (real Chromium, WebGPU
hidden) sees the page say the model needs WebGPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from webbuild.build.wasm_budget import BUDGET, BUDGET_ENV, GIB, shapes_need
from webbuild.zoo.presets import get_preset

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "tiny-asr"
# Node: the largest wasm memory an instantiated module has at exit (memory only grows: the peak)
HEAP_HOOK = """
const mems = new Set();
const scan = (o) => { for (const v of Object.values(o ?? {})) {
  if (v instanceof WebAssembly.Memory) mems.add(v);
  else if (v && typeof v === 'object') {
    for (const w of Object.values(v)) if (w instanceof WebAssembly.Memory) mems.add(w);
  }
} };
for (const name of ['instantiate', 'instantiateStreaming']) {
  const f = WebAssembly[name];
  WebAssembly[name] = async (...a) => {
    const r = await f.apply(WebAssembly, a);
    scan(a[1]);
    scan((r.instance ?? r).exports);
    return r;
  };
}
process.on('exit', () => console.error('WASM_HEAP_BYTES', Math.max(0, ...[...mems].map((m) => m.buffer.byteLength))));
"""


def build(out: Path, budget: int | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, **({BUDGET_ENV: str(budget)} if budget else {}))
    run = subprocess.run([sys.executable, "-m", "webbuild.cli", str(EXAMPLE / "model.yaml"), "-o", str(out)],
                         capture_output=True, text=True, cwd=REPO, timeout=1800, env=env)
    assert run.returncode == 0, run.stderr
    return run


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("wasm") / "dist"
    return out, build(out)


def preset_need(name: str, max_positions: int) -> dict:
    p = get_preset(name)
    t, a = p.text, p.audio
    return shapes_need(layers=t["num_hidden_layers"], hidden=t["hidden_size"], intermediate=t["intermediate_size"],
                       heads=t["num_attention_heads"], kv_heads=t["num_key_value_heads"], head_dim=t["head_dim"],
                       vocab=151_936 if p.qwen_ids else p.bpe_vocab_size, enc_layers=a["encoder_layers"],
                       enc_dim=a["d_model"], enc_ffn=a["encoder_ffn_dim"], max_positions=max_positions)


def test_the_tiny_example_fits_within_a_factor_of_its_measured_wasm_heap(dist, tmp_path):
    out, run = dist
    fit = json.loads((out / "build-report.json").read_text())["variants"]["fp32"]["wasm"]
    manifest = json.loads((out / "model" / "manifest.json").read_text())
    assert manifest["variants"]["fp32"]["wasm"] == {k: fit[k] for k in ("need_bytes", "budget_bytes", "fits")}
    assert fit["fits"] and fit["budget_bytes"] == BUDGET and "why" not in fit
    assert fit["folded_bytes"] > 0 and fit["kv_cache_bytes"] > 0  # the twins fold int4 weights to float32
    assert "fp32: wasm fallback needs about" in run.stderr
    hook = tmp_path / "heap.mjs"
    hook.write_text(HEAP_HOOK)
    node = subprocess.run(["node", "--import", str(hook), "webbuild/tools/bench/bench.mjs", str(out), "--ep", "wasm",
                           "--decode-tokens", "8", "--max-clips", "1"], capture_output=True, text=True, cwd=REPO,
                          timeout=600)
    assert node.returncode == 0, node.stderr
    heap = int(node.stderr.rsplit("WASM_HEAP_BYTES", 1)[1].split()[0])
    print(f"tiny: wasm estimate {fit['need_bytes'] / 2**20:.0f} MiB, measured heap {heap / 2**20:.0f} MiB")
    # generous, but not wildly: measured 207 MiB
    assert heap <= fit["need_bytes"] <= 4 * heap, (heap, fit)


def test_the_estimate_from_dimensions_agrees_with_the_graphs(dist):
    out, _ = dist
    fit = json.loads((out / "build-report.json").read_text())["variants"]["fp32"]["wasm"]
    shapes = preset_need("tiny", fit["max_positions"])
    assert shapes["kv_cache_bytes"] == fit["kv_cache_bytes"]
    assert 0.8 <= shapes["folded_bytes"] / fit["folded_bytes"] <= 1.25, (shapes, fit)
    assert 0.8 <= shapes["need_bytes"] / fit["need_bytes"] <= 1.25, (shapes, fit)


def test_the_0_6b_does_not_fit_a_wasm_page(dist):
    out, _ = dist
    positions = json.loads((out / "build-report.json").read_text())["variants"]["fp32"]["wasm"]["max_positions"]
    need = preset_need("0.6b", positions)
    print(f"0.6b wasm estimate: {need['need_bytes'] / GIB:.2f} GiB", {k: v for k, v in need.items() if k != "why"})
    assert not need["fits"] and need["need_bytes"] > 4 * GIB
    assert need["why"].startswith("its WebAssembly fallback needs ")


@pytest.mark.skipif(shutil.which("chromium") is None and not Path("/usr/bin/chromium").exists(),
                    reason="no Chromium")
def test_a_build_over_budget_refuses_wasm_and_verify_sees_the_page_say_so(tmp_path):
    out = tmp_path / "dist"
    run = build(out, budget=64 << 20)
    fit = json.loads((out / "build-report.json").read_text())["variants"]["fp32"]["wasm"]
    need = f"{fit['need_bytes'] / GIB:.1f} GiB"
    assert f"fp32: no wasm fallback: needs {need} of the 0.1 GiB a wasm page gets; visitors without WebGPU " \
           "are told the model needs WebGPU" in run.stderr
    assert not fit["fits"] and fit["budget_bytes"] == 64 << 20 and fit["need_bytes"] > fit["budget_bytes"]
    assert json.loads((out / "model" / "manifest.json").read_text())["variants"]["fp32"]["wasm"]["fits"] is False
    # first visits on WebGPU (SwiftShader, forced), then the visit with WebGPU hidden expects the refusal
    report_path = tmp_path / "report.json"
    verify = subprocess.run([sys.executable, "-m", "webbuild.cli", "verify", str(out), "--ep", "webgpu", "--json",
                             str(report_path)], capture_output=True, text=True, cwd=REPO, timeout=1800)
    report = json.loads(report_path.read_text())
    checks = {c["name"]: c for c in report["checks"]}
    said = checks["WebGPU off: the page says the model needs WebGPU"]
    assert said["ok"], said
    assert f"This model needs WebGPU: its WebAssembly fallback needs {need}, more than the 0.1 GiB a browser tab " \
           "gets." in said["detail"]
    assert "WebGPU off: model loads" not in checks and "wasm fallback transcribes" not in checks
    assert verify.returncode == 0, verify.stdout + verify.stderr

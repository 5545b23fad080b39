"""scripts/chrome_gpu_bench.py --adapter on the embedded example in Chromium on SwiftShader (--allow-software):
the adapter on and off alternated on one page, both counted and, with --timing, both cut into GPU kernel times
(the decode replays another captured step once the picker switches, and both must be watched)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "chrome_gpu_bench.py"


@pytest.mark.browser
def test_adapter_rounds_count_and_time_both_decodes_on_one_page(example_dist, tmp_path):
    out = tmp_path / "rounds.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--dist", str(example_dist), "--rows", "chromium-webbuild",
                          "--rounds", "1", "--n1", "1", "--n2", "3", "--clips", "0", "--allow-software",
                          "--adapter", "klatt", "--timing", "--timeout", "600", "--out", str(out)],
                         capture_output=True, text=True, timeout=900, check=False)
    assert run.returncode == 0, run.stderr[-3000:] + run.stdout[-2000:]
    result = json.loads(out.read_text())
    rounds = {r["row"]: r for r in result["rounds"]}
    assert list(rounds) == ["chromium-webbuild-lora", "chromium-webbuild"]  # on, then off, on one page
    on, off = rounds["chromium-webbuild-lora"]["per_token"], rounds["chromium-webbuild"]["per_token"]
    assert on["dispatches"] > off["dispatches"] > 0  # the adapted step's branches
    assert on["bind_groups"] == off["bind_groups"] == 0  # both captured
    timing = result["timing_per_token"]
    for row in ("chromium-webbuild-lora", "chromium-webbuild"):
        assert timing[row] and timing[row]["kernels_gpu_ms"], row
    assert "Gemm" in timing["chromium-webbuild-lora"]["kernels_gpu_ms"]  # the ups' kernels, the adapter's alone
    assert "Gemm" not in timing["chromium-webbuild"]["kernels_gpu_ms"]
    assert "| chromium-webbuild-lora |" in run.stdout


@pytest.mark.browser
def test_an_adapter_the_site_lacks_is_one_line(example_dist, tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), "--dist", str(example_dist), "--rows", "chromium-webbuild",
                          "--rounds", "1", "--n1", "1", "--n2", "2", "--clips", "0", "--allow-software",
                          "--adapter", "nope", "--timeout", "600", "--out", str(tmp_path / "r.json")],
                         capture_output=True, text=True, timeout=900, check=False)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1] == "FATAL: --adapter: no adapter 'nope'; the site has klatt"

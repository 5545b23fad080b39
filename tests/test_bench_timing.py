"""Timing attribution of a decode token in `webbuild bench` (webbuild/tools/bench/timing.mjs), on SwiftShader
through Dawn in Node: the tiny example's `timing_per_token` cuts the decode steps into phases that add up to
them, and times each kernel with timestamp queries where the device has the feature (SwiftShader under Dawn
does) or says why not. No figure is compared with a fixed number: SwiftShader on a shared 2-core machine
varies by 2x between runs; only relations that hold for any run are asserted."""

from __future__ import annotations

import pytest

from tests.conftest import BENCH_DECODE as DECODE
from tests.conftest import ONE_CLIP_RUN, decode_forms

ROUNDING = 0.001  # timing.mjs rounds each ms figure to 3 decimals


@pytest.fixture(scope="module", params=["plain", "captured"])
def bench(request, example_dist, webgpu_bench) -> tuple[dict, str]:
    """`webbuild bench --ep webgpu --swiftshader` of the example, its decode steps plain (one run and one
    read-back after the other) or captured (steps queued ahead of the tokens): the report and the table.
    Both forms of one run (--decode-forms both), the one tests/test_bench_counters.py reads."""
    return decode_forms(*webgpu_bench(example_dist, *ONE_CLIP_RUN))[request.param]


def test_the_phases_add_up_to_the_decode_steps(bench):
    r, stdout = bench
    t = r["timing_per_token"]
    assert t["steps"] == DECODE
    assert t["pipelined"] == (r["decode"] == "captured"), (r["decode"], t)
    parts = [t[k] for k in ("pre_ms", "issue_cpu_ms", "readback_wait_ms", "post_ms")]
    # the parts and the wall are means over the same steps, stamped at shared points: equal up to rounding
    assert abs(sum(parts) - t["wall_ms"]) <= 4 * ROUNDING
    if t["pipelined"]:  # a step is queued before the previous token is read: only issue keeps its meaning
        assert t["issue_cpu_ms"] > 0 and t["pre_ms"] < 0 and "queued ahead" in stdout
        return
    assert all(p > 0 for p in parts), t
    # wall_ms is the mean of the steps whose median, p10 and p90 the synthetic decode reports; for 4 values
    # p10 (rank 0.3) <= mean <= p90 (rank 2.7) always holds
    d = r["synthetic_decode"]["ms_per_token"]
    assert d["n"] == DECODE and d["p10"] - ROUNDING <= t["wall_ms"] <= d["p90"] + ROUNDING
    assert t["post_in_run_ms"] <= t["post_ms"]
    # the WebGPU calls are inside the issue phase, and timing them costs a small share of it
    assert 0 < t["webgpu_call_ms"] < t["issue_cpu_ms"] and t["webgpu_calls"] > 0
    wrap_ms = t["webgpu_calls"] * t["wrapper_us_per_call"] / 1000
    assert t["wrapper_us_per_call"] > 0 and wrap_ms < 0.1 * t["issue_cpu_ms"]
    assert "time/token" in stdout and "read-back wait" in stdout


def test_kernels_are_timed_or_the_report_says_why(bench):
    r, stdout = bench
    t, kernels = r["timing_per_token"], r["counters_per_token"]["kernels"]
    assert "gpu kernels" in stdout
    if t["gpu_timing"] != "timestamp-query":
        assert t["gpu_timing"].startswith("unavailable: ") and t["gpu_timing"] in stdout
        assert "gpu_ms" not in t and "kernels_gpu_ms" not in t
        return
    # every kernel the counters saw dispatched has a time, and nothing else has; the sum is gpu_ms
    assert set(t["kernels_gpu_ms"]) == set(kernels)
    assert all(v > 0 for v in t["kernels_gpu_ms"].values())
    assert abs(sum(t["kernels_gpu_ms"].values()) - t["gpu_ms"]) <= 1e-4 * len(kernels)
    assert list(t["kernels_gpu_ms"].values()) == sorted(t["kernels_gpu_ms"].values(), reverse=True)
    cpu_ms = t["issue_cpu_ms"] if t["pipelined"] else t["wall_ms"] - t["readback_wait_ms"]
    assert t["bound"] == ("gpu" if t["gpu_ms"] > cpu_ms else "cpu")
    assert t["gpu_timed_wall_ms"] > 0

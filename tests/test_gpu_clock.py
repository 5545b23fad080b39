"""webbuild/tools/bench/gpu_clock.py: nvidia-smi's samples read back and cut into a row's time window."""

from __future__ import annotations

import shutil
from datetime import datetime

import pytest

from webbuild.tools.bench import gpu_clock


def _line(at: float, mhz: str, util: str) -> str:
    return f"{datetime.fromtimestamp(at).strftime('%Y/%m/%d %H:%M:%S.%f')[:-3]}, {mhz}, {util}"


def test_window_takes_the_samples_of_its_time_only():
    sampler = gpu_clock.ClockSampler()
    t = 1_790_000_000.0
    sampler.path.write_text("\n".join([
        _line(t, "1980", "5"), _line(t + 1, "1185", "40"), _line(t + 1.05, "390", "20"), _line(t + 1.1, "1035", "90"),
        _line(t + 5, "1980", "0"), "2026/12/06 08:00:0",  # a line cut off as nvidia-smi is stopped
        _line(t + 6, "[N/A]", "[N/A]"),
    ]) + "\n")
    w = sampler.window(t + 0.5, t + 2)
    assert w == {"sm_mhz": {"median": 1035.0, "min": 390.0, "max": 1185.0},
                 "util_pct": {"median": 40.0, "min": 20.0, "max": 90.0}, "samples": 3}
    assert sampler.window(t + 10, t + 11) is None
    assert gpu_clock.describe(w) == "1035 MHz (390-1185), 40% busy"
    assert gpu_clock.describe(None) == "-"
    both = gpu_clock.merged([w, None, sampler.window(t - 1, t + 0.5)])
    assert both["sm_mhz"] == {"median": 1507.5, "min": 390.0, "max": 1980.0} and both["samples"] == 4


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has an NVIDIA GPU")
def test_without_nvidia_smi_nothing_is_sampled():
    with gpu_clock.ClockSampler() as clocks:
        start = gpu_clock.now()
    assert clocks.proc is None and clocks.window(start - 1, gpu_clock.now()) is None

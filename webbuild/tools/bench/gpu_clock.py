"""The GPU's own clock beside a GPU figure: `nvidia-smi` samples the SM clock and the utilisation every 50 ms
while a bench runs, and each row or round gets the samples of its own time window.

GPUs manage their clocks, and the same decode runs at very different ones by its form (an H100 at its driver's
default power management: 345-585 MHz under the captured decode, 915-1980 MHz under plain steps, BENCHMARKS.md),
so a time per token means little on another machine without the clock it ran at. Where `nvidia-smi` is missing
(no NVIDIA GPU, a CPU box) the sampler records nothing and every window is None.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path

QUERY = "timestamp,clocks.sm,utilization.gpu"
PERIOD_MS = 50


class ClockSampler:
    """`with ClockSampler() as clocks:` ... `clocks.window(t0, t1)` for wall times from time.time()."""

    def __init__(self, period_ms: int = PERIOD_MS):
        self.period_ms = period_ms
        self.proc: subprocess.Popen | None = None
        fd, name = tempfile.mkstemp(prefix="gpu-clock-", suffix=".csv")
        os.close(fd)  # nvidia-smi writes it through a file of its own
        self.path = Path(name)
        self.kept: list[tuple[float, float, float]] = []  # the samples, once the sampler has stopped

    def __enter__(self) -> ClockSampler:
        smi = shutil.which("nvidia-smi")
        if smi:
            with self.path.open("w") as out:
                self.proc = subprocess.Popen([smi, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                                              f"-lms={self.period_ms}"], stdout=out, stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.kept = self.samples()  # read once more, then the file goes
        self.path.unlink(missing_ok=True)

    def samples(self) -> list[tuple[float, float, float]]:
        """(wall time, SM MHz, utilisation %) of every sample so far."""
        if not self.path.exists():
            return self.kept
        out = []
        for line in self.path.read_text().splitlines():
            parts = [p.strip() for p in line.split(",")]
            try:
                at = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                out.append((at, float(parts[1]), float(parts[2])))
            except (ValueError, IndexError):
                continue  # a line cut off at the end, or a GPU that reports [N/A]
        return out

    def window(self, t0: float, t1: float) -> dict | None:
        """The SM clock (MHz) and the utilisation (%) between wall times t0 and t1: median, min, max; None
        without samples there."""
        return summarise([s for s in self.samples() if t0 <= s[0] <= t1])


def summarise(samples: list[tuple[float, float, float]]) -> dict | None:
    if not samples:
        return None
    sm = [s[1] for s in samples]
    util = [s[2] for s in samples]
    return {"sm_mhz": {"median": statistics.median(sm), "min": min(sm), "max": max(sm)},
            "util_pct": {"median": statistics.median(util), "min": min(util), "max": max(util)},
            "samples": len(samples)}


def merged(windows: list[dict | None]) -> dict | None:
    """Several windows' figures as one: the median of their medians, the lowest min, the highest max."""
    ws = [w for w in windows if w]
    if not ws:
        return None
    return {key: {"median": statistics.median(w[key]["median"] for w in ws), "min": min(w[key]["min"] for w in ws),
                  "max": max(w[key]["max"] for w in ws)} for key in ("sm_mhz", "util_pct")} | {
        "samples": sum(w["samples"] for w in ws)}


def describe(clock: dict | None) -> str:
    """'1035 MHz (390-1245), 62% busy' for a table cell; '-' without samples."""
    if not clock:
        return "-"
    sm, util = clock["sm_mhz"], clock["util_pct"]
    return f"{sm['median']:.0f} MHz ({sm['min']:.0f}-{sm['max']:.0f}), {util['median']:.0f}% busy"


def now() -> float:
    return time.time()

"""`webbuild bench --rounds --adapter` on the embedded example in Chromium on SwiftShader (--allow-software):
the adapter on and off alternated on one page, both counted and, with --timing, both cut into GPU kernel times
(the decode replays another captured step once the picker switches, and both must be watched); --step-trace's
captured steps and replay bursts."""

from __future__ import annotations

import json

import pytest

from tests.command import webbuild


@pytest.mark.slow
@pytest.mark.browser
def test_adapter_rounds_count_and_time_both_decodes_on_one_page(example_dist, tmp_path):
    out = tmp_path / "rounds.json"
    run = webbuild("bench", example_dist, "--rounds", "1", "--row", "chromium-webbuild", "--short-decode", "1",
                   "--decode-tokens", "3", "--max-clips", "0", "--allow-software", "--adapter", "klatt", "--timing",
                   "--step-trace", "2", "--json", out, timeout=900)
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
    # --step-trace: the captured steps one by one in each form, then the replay alone in each burst form (a round
    # each, as the rows)
    assert [(t["in_flight"], t["yield_each"]) for t in result["step_trace"]] == [(3, False), (12, False), (3, True),
                                                                                 (12, True)]
    bursts = result["replay_bursts"]
    assert [b["form"] for b in bursts] == ["runs", "map", "done"]
    assert all(b["n"] == 2 and len(b["runs"]) == 2 and b["wall_ms"] >= b["issued_ms"] > 0 for b in bursts)
    assert all(len(b["mapped"]) == (2 if b["form"] == "map" else 0) for b in bursts)
    # 'done' waits for each step's GPU work before the next run: its issue takes the whole burst
    assert all(b["issued_ms"] > 0.5 * b["wall_ms"] for b in bursts if b["form"] == "done")


@pytest.mark.browser
def test_an_adapter_the_site_lacks_is_one_line(example_dist, tmp_path):
    run = webbuild("bench", example_dist, "--rounds", "1", "--row", "chromium-webbuild", "--short-decode", "1",
                   "--decode-tokens", "2", "--max-clips", "0", "--allow-software", "--adapter", "nope",
                   timeout=900)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1] == "error: no adapter 'nope'; the site has klatt"


def test_rows_that_need_a_peer_or_do_not_exist_and_bad_lengths_are_one_line(tmp_path):
    """Refused before any browser starts."""
    run = webbuild("bench", tmp_path, "--rounds", "1", "--row", "chromium-peer")
    assert run.returncode == 2 and run.stderr.strip().splitlines()[-1] == (
        "error: rows chromium-peer and node-peer need --peer DIR (the onnxruntime-genai builder's output)")
    run = webbuild("bench", tmp_path, "--rounds", "1", "--row", "chromium-nope")
    assert run.returncode == 2 and run.stderr.strip().splitlines()[-1] == (
        "error: unknown --row chromium-nope: chromium-webbuild[:QUERY], chromium-peer, node-webbuild, node-peer")
    run = webbuild("bench", tmp_path, "--first-use", "1,abc")
    assert run.returncode == 2 and run.stderr.strip().splitlines()[-1] == (
        "error: --first-use '1,abc': clip lengths in seconds, each above 0 and at most 600, comma-separated, "
        "e.g. 1,2.5,5")

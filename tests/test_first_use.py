"""No first-use stall: once the page is ready, the first clip of any length makes onnxruntime-web compile no
new WebGPU pipeline. The embedded example's site on SwiftShader WebGPU in Chromium, its worker with the
bench's counters in front (tools/bench/instrument.py counted_site: every createComputePipeline(Async) counted
and named); after the warm-up, clips of speech (the samples, one after another, cut to the length) of
1 to 30 s, each transcribed as one chunk by the site's own recogniser (tools/bench/first_use.py)."""

from __future__ import annotations

import json

import pytest

from webbuild.site.contract import SAMPLES_FILE
from webbuild.tools import browser as br
from webbuild.tools.bench import first_use as fu
from webbuild.tools.bench.instrument import counted_site
from webbuild.tools.bench.page_bench import site_worker
from webbuild.tools.bench.rounds import timeline_pipelines
from webbuild.tools.serve import start


@pytest.mark.slow
def test_no_new_pipeline_after_warm_up_at_any_clip_length(playwright, example_dist, tmp_path):
    site = counted_site(example_dist, tmp_path / "site")
    clips = fu.speech(example_dist, json.loads((example_dist / SAMPLES_FILE).read_text())["samples"])
    srv = start(site, quiet=True)
    browser = br.launch(playwright, br.choose())
    try:
        page = browser.new_page()
        br.open_page(page, srv.url + "?ep=webgpu&warm=shapes", 900)
        state = page.evaluate("() => window.webbuild")
        assert state["status"] == "ready" and state["info"]["ep"] == "webgpu", state
        # the encoder's part of the warm-up ran between its session and the decoder's
        assert 0 < state["info"]["load"]["encoder_warmup_ms"] < state["info"]["load"]["session_ms"], state["info"]
        worker = site_worker(page)
        made = worker.evaluate("() => self.__gpuCounters.counts.pipelines")
        assert made > 20  # the counter sees the compiles
        # the load's steps, each with the pipelines made within it: the warm-up's steps make them
        steps = {s["step"]: s["pipelines"] for s in
                 timeline_pipelines(state["info"], worker.evaluate("() => self.__gpuCounters.created"))}
        assert steps["encoder warm-up"] > 0 and steps["decoder warm-up"] > 0 and sum(steps.values()) <= made, steps
        # two tokens a clip: the decode's steps replay the graph captured at load; the prompt is what varies
        rows = fu.sweep(worker, fu.FIRST_USE_SECONDS, clips, max_new_tokens=2)
    finally:
        browser.close()
        srv.shutdown()
    assert [r["prompt_tokens"] for r in rows] == sorted({r["prompt_tokens"] for r in rows})  # every length its own
    assert {r["seconds"]: r["encoder_pipelines"] + r["decoder_pipelines"] for r in rows} == {
        s: [] for s in fu.FIRST_USE_SECONDS}

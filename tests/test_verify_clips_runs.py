"""`webbuild verify --clips-ep`: which clip runs ride on the first visit's page (webbuild/tools/verify/visits.py):
a later --clips-ep on --ep's provider, never the first (the second visit's, from the cache) nor one on another."""

from __future__ import annotations

import pytest

from webbuild.tools.verify.visits import ClipsRun, Options, Verifier


@pytest.mark.parametrize(("ep", "runs", "first_visit"), [
    ("webgpu", (ClipsRun("wasm"), ClipsRun("webgpu", 4)), [ClipsRun("webgpu", 4)]),  # make e2e E2E_EP=webgpu's
    ("wasm", (ClipsRun("wasm"), ClipsRun("webgpu", 4)), []),  # make e2e's: WebGPU's clips on a visit of their own
    ("wasm", (ClipsRun("auto"), ClipsRun("webgpu", 1)), []),  # the green verify's: WebGPU on a visit of its own
    ("webgpu", (ClipsRun("webgpu", 2),), []),  # the first: the second visit's
    (None, (ClipsRun("wasm"), ClipsRun("auto")), []),  # the page's own choice is known only on the page
])
def test_later_clips_on_the_samples_provider_run_on_the_first_visit(ep, runs, first_visit):
    assert Verifier(Options("dist", ep=ep, clips_eps=runs)).first_visit_clips() == first_visit

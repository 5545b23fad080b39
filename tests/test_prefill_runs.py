"""The WebGPU prefill's run length (runtime/asr.js longRunsAgree): the build starts a decoder with
GroupQueryAttention at runs of webgpu_prefill_chunk tokens; the warm-up compares one run of twice that and more
with such runs on the adapter and puts the whole prompt in one run where they agree. `webbuild bench` of the
tiny example on SwiftShader through Dawn (the warm-up of every shape class, as on a hardware GPU) reports what
the check measured and decided, and its clip, a prompt longer than one run, is transcribed on that path."""

from __future__ import annotations

from tests.conftest import ONE_CLIP_RUN
from webbuild.pipeline.assemble import WEBGPU_GQA_PREFILL_CHUNK


# not marked slow: it reads the run that test_bench_counters.py, a slow module and so run first, makes
def test_the_check_decides_the_run_length_and_the_clip_is_right(example_dist, webgpu_bench):
    # the check runs in a warm-up of the shape classes (the fixture's own warm-up, a second of silence, has none)
    r, _ = webgpu_bench(example_dist, *ONE_CLIP_RUN)
    runs = r["prefill_runs"]
    check = runs["check"]
    assert check["limit"] == WEBGPU_GQA_PREFILL_CHUNK and check["tokens"] == 2 * WEBGPU_GQA_PREFILL_CHUNK + 2
    assert isinstance(check["relative_diff"], (int, float)) and check["relative_diff"] >= 0, check  # JSON null: a NaN
    assert runs["limit"] == (0 if check["agree"] else WEBGPU_GQA_PREFILL_CHUNK), runs
    clip, = r["clips"]
    assert clip["prompt_tokens"] > WEBGPU_GQA_PREFILL_CHUNK  # more than one run where the limit holds
    assert clip["text"] == clip["expected"], clip

"""The one chunk policy: webbuild/reference/chunk.py against runtime/chunk.js under Node, cut for cut, whole
and streamed in blocks; and where it cuts (at pauses, long audio without one at its quietest stretch)."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace

import numpy as np
import pytest

from webbuild.pipeline.render import TEMPLATE_DIR
from webbuild.reference.chunk import DEFAULT_POLICY, Chunker, ChunkPolicy, LiveChunker, live_chunks, split_at_quiet

pytestmark = pytest.mark.skipif(not shutil.which("node"), reason="no node")
SR = 16000
POLICIES = {"default": DEFAULT_POLICY, "join 0": replace(DEFAULT_POLICY, join_seconds=0),
            "max 8": ChunkPolicy(max_seconds=8, min_seconds=4, join_seconds=5)}


def sentences(seconds: float, seed: int = 0) -> tuple[np.ndarray, list[int]]:
    """Bursts of 'speech' (tones under a syllable envelope, 1.5-6 s) between pauses of 0.4-1 s, each sentence at
    its own level over its own background noise, as joined recordings are; and where each pause starts."""
    rng = np.random.default_rng(seed)
    parts, pauses, at = [], [], 0
    while at < seconds * SR:
        n = int(rng.uniform(1.5, 6) * SR)
        t = np.arange(n) / SR
        level, noise = rng.uniform(0.1, 0.6), rng.uniform(1e-4, 3e-3)
        speech = level * np.sin(2 * np.pi * rng.uniform(120, 300) * t) * np.abs(np.sin(2 * np.pi * 2.5 * t))
        gap = int(rng.uniform(0.4, 1.0) * SR)
        parts.append(np.concatenate([speech, np.zeros(gap)]) + noise * rng.standard_normal(n + gap))
        pauses.append(at + n)
        at += n + gap
    return np.concatenate(parts).astype(np.float32), pauses


def js_cuts(pcm: np.ndarray, policies: dict[str, ChunkPolicy]) -> dict:
    """Per policy: runtime/chunk.js's cuts of the whole, and of the same audio fed in blocks of 1-20000 samples."""
    script = f"""
      import {{ Chunker, splitAtQuiet }} from './runtime/chunk.js';
      const pcm = Float32Array.from({json.dumps(pcm.tolist())});
      const out = {{}};
      for (const [name, p] of Object.entries({json.dumps({k: v.as_json() for k, v in policies.items()})})) {{
        const c = new Chunker({SR}, p), fed = [];
        for (let i = 0, b = 1; i < pcm.length; i += b, b = (b * 31 + 7) % 20000 + 1) {{
          fed.push(...c.feed(pcm.subarray(i, i + b)));
        }}
        fed.push(...c.finish());
        out[name] = {{ whole: splitAtQuiet(pcm, {SR}, p), blocks: fed.map(([s, piece]) => [s, s + piece.length]) }};
      }}
      console.log(JSON.stringify(out));
    """
    run = subprocess.run(["node", "--input-type=module"], input=script, cwd=TEMPLATE_DIR, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_python_and_js_cut_at_the_same_samples_whole_and_streamed():
    pcm, _ = sentences(100)
    js = js_cuts(pcm, POLICIES)
    for name, policy in POLICIES.items():
        py = [list(c) for c in split_at_quiet(pcm, SR, policy)]
        assert js[name]["whole"] == py, name
        assert js[name]["blocks"] == py, name
        c, fed, i = Chunker(SR, policy), [], 0
        for b in (1, 7777, 20000, 3, 160000):
            fed += [(s, s + len(p)) for s, p in c.feed(pcm[i:i + b])]
            i += b
        fed += [(s, s + len(p)) for s, p in c.feed(pcm[i:])] + [(s, s + len(p)) for s, p in c.finish()]
        assert [list(x) for x in fed] == py, name


def test_every_pause_ends_a_chunk_with_join_0():
    """join 0: a chunk per sentence, each cut in the pause after it, keep_seconds before the next speech."""
    pcm, pauses = sentences(60, seed=2)
    chunks = split_at_quiet(pcm, SR, POLICIES["join 0"])
    assert len(chunks) == len(pauses)
    nexts = pauses[1:] + [len(pcm)]
    for (_, end), pause, following in zip(chunks[:-1], pauses, nexts):
        assert pause < end < following  # after the speech, in the pause (the next speech starts after it)


def test_default_policy_joins_sentences_up_to_max():
    pcm, _ = sentences(100, seed=3)
    chunks = split_at_quiet(pcm, SR, DEFAULT_POLICY)
    lengths = [(b - a) / SR for a, b in chunks]
    assert max(lengths) <= 30 and min(lengths[:-1]) > 20  # as few chunks as the pauses allow
    assert chunks[0][0] == 0 and chunks[-1][1] == len(pcm) and all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))


def test_audio_without_pauses_is_cut_at_its_quietest_within_max():
    t = np.arange(70 * SR) / SR
    pcm = (0.5 * np.sin(t * 2300)).astype(np.float32)
    pcm[25 * SR:int(25.1 * SR)] *= 0.05  # a dip too short to be a pause
    chunks = split_at_quiet(pcm, SR, DEFAULT_POLICY)
    assert 25 * SR <= chunks[0][1] <= 25.1 * SR and all(b - a <= 30 * SR for a, b in chunks)
    assert split_at_quiet(pcm[:SR], SR) == [(0, SR)]


BUDGET_SAMPLES = [1, 1599, 1600, 1601, 16000, 48001, 320000, 10**7]  # chunk lengths whose token budgets are compared


def js_live_cuts(pcm: np.ndarray, policy: ChunkPolicy) -> dict:
    """runtime/chunk.js LiveChunker's cuts of `pcm` fed in blocks of 1-20000 samples, and in one block."""
    script = f"""
      import {{ LiveChunker, livePolicy, tokenBudget }} from './runtime/chunk.js';
      const pcm = Float32Array.from({json.dumps(pcm.tolist())});
      const p = {json.dumps(policy.as_json())};
      const cuts = (blocks) => {{
        const c = new LiveChunker({SR}, p), out = [];
        for (const b of blocks) out.push(...c.feed(b));
        out.push(...c.finish());
        return out.map(([s, piece, speech]) => [s, s + piece.length, speech]);
      }};
      const blocks = [];
      for (let i = 0, b = 1; i < pcm.length; i += b, b = (b * 31 + 7) % 20000 + 1) blocks.push(pcm.subarray(i, i + b));
      const lag = new LiveChunker({SR}, p).lagSeconds;
      const budgets = {json.dumps(BUDGET_SAMPLES)}.map((n) => tokenBudget(p, n, {SR}, 200));
      console.log(JSON.stringify({{ blocks: cuts(blocks), whole: cuts([pcm]), lag, budgets,
        live: livePolicy({json.dumps(DEFAULT_POLICY.as_json())}) }}));
    """
    run = subprocess.run(["node", "--input-type=module"], input=script, cwd=TEMPLATE_DIR, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_live_cuts_python_and_js_alike_and_in_every_pause_before_the_next_speech():
    """The live policy: every pause after speech ends a chunk, cut in the pause, decided from the audio up to
    lag_seconds after the speech ended (before the next speech begins); Python and JS cut at the same samples
    whatever the blocks."""
    policy = DEFAULT_POLICY.live()
    pcm, pauses = sentences(60, seed=4)
    py = [(s, s + len(piece), speech) for s, piece, speech in
          live_chunks((pcm[i:i + 5000] for i in range(0, len(pcm), 5000)), SR, policy)]
    js = js_live_cuts(pcm, policy)
    assert js["blocks"] == js["whole"] == [list(c) for c in py]
    assert js["live"] == policy.as_json() and js["lag"] == LiveChunker(SR, policy).lag_seconds
    # a chunk's decode bound: 10 tokens a second of its audio, at most max_new_tokens; none outside the live policy
    assert js["budgets"] == [policy.token_budget(n, SR, 200) for n in BUDGET_SAMPLES] == [1, 1, 1, 2, 10, 31, 200, 200]
    assert DEFAULT_POLICY.token_budget(10**7, SR, 200) == 200 and DEFAULT_POLICY.token_budget(1600, SR, 7) == 7
    assert py[0][0] == 0 and py[-1][1] == len(pcm) and all(a[1] == b[0] for a, b in zip(py, py[1:]))
    speech = [(a, b) for a, b, s in py if s]
    assert len(speech) == len(pauses)  # a chunk per sentence; the rest of each pause is a quiet chunk
    for (_, end), pause, following in zip(speech, pauses, pauses[1:] + [len(pcm)]):
        assert pause < end <= following
    for (start, _), before in zip(speech[1:], pauses):  # a speech chunk starts shortly before its speech
        assert before < start
    # each cut is decided once the audio reaches lag_seconds past the pause's start: before the next speech
    chunker, decided, fed = LiveChunker(SR, policy), [], 0
    for i in range(0, len(pcm), 160):
        fed += len(pcm[i:i + 160])
        decided += [fed for *_, speech in chunker.feed(pcm[i:i + 160]) if speech]
    lag = int(chunker.lag_seconds * SR) + 2 * 320  # the frame grid of each chunk: within two frames
    assert all(pause < at <= pause + lag for at, pause in zip(decided, pauses)), (decided, pauses)


def test_live_audio_without_pauses_is_cut_at_max():
    policy = DEFAULT_POLICY.live()
    t = np.arange(40 * SR) / SR
    pcm = (0.5 * np.sin(t * 2300) * np.abs(np.sin(2 * np.pi * 1.5 * t))).astype(np.float32)  # syllables, no pause
    chunks = [(s, s + len(p), speech) for s, p, speech in live_chunks([pcm], SR, policy)]
    assert all(b - a <= policy.max_seconds * SR and speech for a, b, speech in chunks) and chunks[-1][1] == len(pcm)
    assert js_live_cuts(pcm, policy)["blocks"] == [list(c) for c in chunks]


def test_policy_overrides_keep_join_within_max():
    p = DEFAULT_POLICY.override(10)
    assert (p.max_seconds, p.min_seconds, p.join_seconds) == (10, 5, 10)
    assert DEFAULT_POLICY.override(None, 0).join_seconds == 0 and DEFAULT_POLICY.override(8, 12).join_seconds == 8
    assert ChunkPolicy.of({"chunking": p.as_json()}) == p
    live = p.live()
    assert (live.join_seconds, live.max_seconds, live.floor_seconds) == (0, 10, 0.3)
    assert ChunkPolicy.of_live({"chunking": p.as_json()}) == live
    assert ChunkPolicy.of_live({"chunking_live": live.as_json()}) == live


def test_a_decoder_whose_rope_caches_a_chunk_outruns_is_refused(tmp_path):
    """GroupQueryAttention fails in onnxruntime past its cos/sin caches: the build refuses such a decoder for its
    chunk length instead (the fuse stage sizes the caches to cover a chunk)."""
    import onnx
    from onnx import TensorProto, helper

    from webbuild.errors import BuildError
    from webbuild.pipeline.assemble import check_rope_positions

    cache = helper.make_tensor("cos_cache", TensorProto.FLOAT, [100, 4], [0.0] * 400)
    node = helper.make_node("GroupQueryAttention", [f"i{k}" for k in range(7)] + ["cos_cache", "cos_cache"], ["o"],
                            domain="com.microsoft")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(f"i{k}", TensorProto.FLOAT, None)
                                            for k in range(7)],
                              [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)], [cache])
    onnx.save(helper.make_model(graph), tmp_path / "decoder.onnx")
    check_rope_positions(tmp_path / "decoder.onnx", 100)
    with pytest.raises(BuildError, match="hold 100 positions, but a chunk of long audio reaches 101"):
        check_rope_positions(tmp_path / "decoder.onnx", 101)

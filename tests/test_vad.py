"""Speech detection, one policy in two languages: webbuild/reference/vad.py (onnxruntime CPU) against
runtime/vad.js (onnxruntime-web's wasm EP under Node) on the same Silero VAD model, segment for segment, on real
espeak-ng speech with pauses, noise, silence and tones; and what the segments say about each."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from tests.vad_audio import SR, mixed, silence, speech, tones, white_noise
from webbuild.pipeline.render import TEMPLATE_DIR
from webbuild.reference.chunk import DEFAULT_POLICY, chunks_of, split_at_quiet, to_speech
from webbuild.reference.vad import DEFAULT_VAD, Vad, speech_segments, vad_model_path, window_speech
from webbuild.site.ort_files import ORT_FILES_DIR
from webbuild.tools.bench import node_args  # --liftoff-only under the tests: Node waits minutes at exit otherwise

pytestmark = pytest.mark.skipif(not shutil.which("node"), reason="no node")


@pytest.fixture(scope="module")
def vad() -> Vad:
    return Vad()


def js_vad(clips: dict[str, np.ndarray]) -> dict:
    """runtime/vad.js on each clip pushed in uneven blocks, some judged before the next comes: its windows'
    probabilities and its segments."""
    folder = TEMPLATE_DIR.parent / "tools" / "bench"
    model, policy = json.dumps(str(vad_model_path())), json.dumps(DEFAULT_VAD.as_json())
    script = f"""
      import {{ readFileSync }} from 'node:fs';
      import {{ importOrt }} from '{(folder / "ort.mjs").as_posix()}';
      import {{ createVad, speechSegments }} from './runtime/vad.js';
      const ort = await importOrt({json.dumps(str(ORT_FILES_DIR))});
      const vad = await createVad(ort, readFileSync({model}), {policy});
      const clips = JSON.parse(readFileSync(0, 'utf8'));
      const out = {{}};
      for (const [name, samples] of Object.entries(clips)) {{
        const pcm = Float32Array.from(samples);
        const s = vad.stream();
        for (let i = 0, b = 1; i < pcm.length; i += b, b = (b * 31 + 7) % 9000 + 1) {{
          s.push(pcm.subarray(i, i + b));
          if (b % 3) await s.advance();
        }}
        await s.finish();
        out[name] = {{ segments: speechSegments(s.probs, s.samples, vad.policy), probs: s.probs }};
      }}
      console.log(JSON.stringify(out));
    """
    run = subprocess.run(["node", *node_args(), "--input-type=module", "-e", script], input=json.dumps(
        {k: v.tolist() for k, v in clips.items()}), cwd=TEMPLATE_DIR, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_python_and_js_find_the_same_speech(vad):
    speech_clip, sentences = mixed()
    clips = {"speech": speech_clip, "noise": white_noise(4), "zeros": silence(3), "low noise": silence(3, 0.003),
             "tones": tones(6)}
    js = js_vad(clips)
    for name, pcm in clips.items():
        py = [list(s) for s in vad.segments(pcm)]
        assert js[name]["segments"] == py, name
        probs, _ = vad.probabilities([pcm])
        assert np.abs(np.asarray(js[name]["probs"]) - probs).max() < 1e-4, name
    found = vad.segments(speech_clip)
    # every sentence is found, and each segment lies on a sentence (the fillers between give none)
    assert all(any(a < e and b > s for a, b in found) for s, e in sentences), (found, sentences)
    assert all(any(a < e + 0.2 * SR and b > s - 0.2 * SR for s, e in sentences) for a, b in found), (found, sentences)
    for name in ("noise", "zeros", "low noise", "tones"):
        assert js[name]["segments"] == [], name


def test_no_speech_in_a_minute_of_noise_nor_in_silence_or_tones(vad):
    for name, pcm in {"60 s white noise": white_noise(60), "30 s zeros": silence(30),
                      "30 s low noise": silence(30, 0.003), "30 s tones": tones(30)}.items():
        assert vad.segments(pcm) == [], name


def test_segments_follow_silero_rules():
    w = DEFAULT_VAD.window
    probs = np.array([0.1] * 10 + [0.9] * 12 + [0.2] * 2 + [0.9] * 10 + [0.1] * 10 + [0.9] * 3 + [0.1] * 10, np.float32)
    got = speech_segments(probs, len(probs) * w)
    # a 2-window dip (64 ms) is shorter than min_silence (100 ms): one segment; 3 windows (96 ms) is too short speech
    assert got == [(10 * w - 480, 34 * w + 480)]


def test_file_chunks_are_folded_onto_speech(vad):
    clip, sentences = mixed()
    speech_at = vad.stretches(vad.segments(clip))
    assert len(speech_at) == len(sentences)  # the fillers between sentences (1.5-2 s) split them
    whole = split_at_quiet(clip, SR, DEFAULT_POLICY)
    keep = int(DEFAULT_POLICY.keep_seconds * SR)
    trimmed = [span for s, e in whole for span in to_speech(s, e, speech_at, keep)]
    pieces = list(chunks_of([clip[i:i + 7000] for i in range(0, len(clip), 7000)], SR, DEFAULT_POLICY, speech_at))
    assert [len(p) for p in pieces] == [e - s for s, e in trimmed]
    assert sum(e - s for s, e in trimmed) < 0.8 * len(clip)  # the fillers are left out
    assert list(chunks_of([white_noise(10)], SR, DEFAULT_POLICY, vad.segments(white_noise(10)))) == []


def test_a_live_chunk_speaks_only_where_its_own_windows_have_speech(vad):
    s = speech("harmony emerge surprise")
    clip = np.concatenate([white_noise(3, 0.1), s, silence(1)])
    probs, _ = vad.probabilities([clip])
    assert not window_speech(probs, 0, 3 * SR)
    assert window_speech(probs, 3 * SR, 3 * SR + len(s))

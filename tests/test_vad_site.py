"""Speech detection on the built example (issue 50): the site ships Silero VAD and its policy; 60 s of white noise,
30 s of silence (zeros, low noise) and 30 s of music-like tones give an empty transcript in `webbuild transcribe`
(files and --live) and on the page (Chromium, wasm EP), file and live (live plays in real time: there a quarter of
each, 37.5 s in all); the page's chunks of speech among noise are the reference's, token for token. Without speech
detection the noise and the tones give text."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.command import webbuild
from tests.vad_audio import SR, mixed, silence, tones, white_noise
from webbuild.reference.audio import read_wav, write_wav
from webbuild.reference.transcribe import load_transcriber
from webbuild.reference.vad import DEFAULT_VAD, VAD_FILE
from webbuild.site.contract import RUNTIME_FILE
from webbuild.site.manifest import load_manifest, reassemble
from webbuild.tools.browser import choose, open_site, wait_for
from webbuild.tools.serve import start
from webbuild.tools.verify import live as live_check

DONE = "() => window.webbuild.status === 'done' || window.webbuild.error"
NOT_SPEECH = {"noise-60s": lambda: white_noise(60), "zeros-30s": lambda: silence(30),
              "low-noise-30s": lambda: silence(30, 0.003), "tones-30s": lambda: tones(30)}
LIVE_SHARE = 4  # the live session plays each for a quarter of its length (in real time: 37.5 s instead of 150)


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("not-speech")
    out = {}
    for name, make in NOT_SPEECH.items():
        write_wav(folder / f"{name}.wav", make())
        out[name] = folder / f"{name}.wav"
    write_wav(folder / "mixed.wav", mixed()[0])
    out["mixed"] = folder / "mixed.wav"
    return out


def test_the_site_ships_silero_vad_and_its_policy(example_dist, tmp_path):
    manifest = load_manifest(example_dist / "model")
    reassemble(example_dist / "model", manifest, RUNTIME_FILE, tmp_path / RUNTIME_FILE)
    assert json.loads((tmp_path / RUNTIME_FILE).read_text())["vad"] == DEFAULT_VAD.as_json()
    assert manifest["files"][VAD_FILE]["size"] == 2_327_524


def test_no_text_from_noise_silence_or_tones_in_the_cli(example_dist, clips):
    paths = [clips[name] for name in NOT_SPEECH]
    for mode in ((), ("--live",)):
        run = webbuild("transcribe", example_dist, *paths, "--json", *mode)
        assert run.returncode == 0, run.stderr
        rows = [json.loads(line) for line in run.stdout.splitlines()]
        assert [(Path(r["audio"]).stem, r["text"]) for r in rows] == [(name, "") for name in NOT_SPEECH], mode


def test_without_speech_detection_noise_and_tones_give_text(example_dist, clips):
    reference = load_transcriber(example_dist)
    reference.vad = None  # as the site was before: every chunk decoded
    for name in ("noise-60s", "tones-30s"):
        assert reference.file_text(reference.decode_file(clips[name])), name


@pytest.fixture(scope="module")
def page(playwright, example_dist):
    srv = start(example_dist, quiet=True)
    browser, page, _ = open_site(playwright, srv, "", webgpu=False)  # the CPU path: wasm
    yield page
    browser.close()
    srv.shutdown()


def transcribe_on_the_page(page, audio: Path) -> dict:
    page.set_input_files("#file", str(audio))
    wait_for(page, DONE, 600)
    state = page.evaluate("() => window.webbuild")
    assert state["error"] is None, state["error"]
    return state


def test_no_text_from_noise_silence_or_tones_on_the_page(page, clips):
    for name in NOT_SPEECH:
        state = transcribe_on_the_page(page, clips[name])
        assert (state["texts"], state["tokens"], state["chunks"]) == ([], [], []), name
        assert page.inner_text("#transcript") == "(no speech recognised)", name
        assert state["metrics"]["vad_ms"] > 0, name


def test_the_pages_speech_chunks_and_tokens_are_the_references(page, clips, example_dist):
    reference = load_transcriber(example_dist, ep="wasm")  # the graphs the wasm EP runs
    pcm = read_wav(clips["mixed"])
    assert reference.vad is not None
    chunks = reference.chunk_ranges(pcm)
    state = transcribe_on_the_page(page, clips["mixed"])
    assert state["chunks"] == [list(c) for c in chunks]
    assert state["tokens"] == [reference.decode(pcm[s:e]).tokens for s, e in chunks]
    assert sum(e - s for s, e in chunks) < 0.8 * len(pcm)  # the noise, the tones and the silences left out


def test_no_text_from_noise_silence_or_tones_live(playwright, example_dist, tmp_path):
    """One live session through Chromium's fake microphone, in real time: all four one after the other (a quarter
    of each)."""
    pcm = np.concatenate([(x := make())[: len(x) // LIVE_SHARE] for make in NOT_SPEECH.values()])
    wav = tmp_path / "not-speech.wav"
    write_wav(wav, pcm)
    srv = start(example_dist, quiet=True)
    try:
        run = live_check.drive(playwright, choose(), f"{srv.url}?ep=wasm", wav, len(pcm) / SR, 600)
    finally:
        srv.shutdown()
    assert run.error is None, run.error
    assert run.state["finals"] and all(text == "" for text in run.state["finals"]), run.state["finals"]
    assert not [u for u in run.state["updates"] if u["text"]]  # no partial text either

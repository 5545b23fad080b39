"""Real audio through every path, on the trained example: the page's 16 kHz samples read back from Chromium
against the Python reference's at several source rates; a long recording (a couple of minutes of joined
held-out clips) through `webbuild transcribe SITE` and through the page, which must cut it into the same
chunks and give the same tokens; malformed files, one line and exit code 2 from the CLI."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from tests.command import webbuild
from tests.test_resample import malformed
from webbuild.reference.audio import read_wav
from webbuild.reference.transcribe import load_transcriber
from webbuild.reference.wer import corpus_wer
from webbuild.tools.browser import open_site, wait_for
from webbuild.tools.serve import start
from webbuild.tools.verify.tokens import first_difference
from webbuild.train.clips import parse_rates, write_heldout_clips

RATES = "22050,44100x2,48000,8000"


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """8 held-out clips at four source rates, and 40 joined into one 16 kHz file of about 2.5 minutes."""
    root = tmp_path_factory.mktemp("audio-paths")
    rated = write_heldout_clips(root / "rated", 8, rates=parse_rates(RATES))
    write_heldout_clips(root / "plain", 40, joined=root / "long.wav")
    return root, rated


@pytest.fixture(scope="module")
def page(playwright, example_dist):
    srv = start(example_dist, quiet=True)
    browser, page, _ = open_site(playwright, srv, "?ep=wasm", webgpu=False)
    try:
        yield page
    finally:
        browser.close()
        srv.shutdown()


def test_page_resamples_as_the_reference(page, clips):
    """The page's decodeToMono16k (WAV parsed, the project's resampler) gives the reference's samples, <= 1e-5."""
    _, rated = clips
    for path in rated[:4]:
        got = page.evaluate("""async (b64) => {
            const { decodeToMono16k } = await import('./app/audio.js');
            const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
            return Array.from(await decodeToMono16k(bytes.buffer, 'clip'));
        }""", base64.b64encode(path.read_bytes()).decode())
        ref = read_wav(path)
        assert len(got) == len(ref) and np.abs(np.array(got) - ref).max() <= 1e-5, path.name


def test_long_recording_cli_and_page_agree(page, clips, example_dist):
    root, _ = clips
    long = root / "long.wav"
    run = webbuild("transcribe", example_dist, long, "--json", timeout=600)
    assert run.returncode == 0, run.stderr
    cli = json.loads(run.stdout)
    t = load_transcriber(example_dist)
    chunks = t.decode_file(long)
    assert cli["text"] == t.file_text(chunks) and len(chunks) >= 30  # a chunk per sentence (join_seconds 0)
    # within a point of WER of the same clips one by one
    one_by_one = [(p.with_suffix(".txt").read_text().strip(), t.transcribe(read_wav(p)))
                  for p in sorted((root / "plain").glob("*.wav"))]
    assert cli["wer"] <= corpus_wer(one_by_one) + 0.01
    page.set_input_files("#file", str(long))
    wait_for(page, "() => window.webbuild.status === 'done' || window.webbuild.error", 600)
    state = page.evaluate("() => window.webbuild")
    assert state["error"] is None and len(state["tokens"]) == len(chunks)  # the same chunks
    for got, margins, ref in zip(state["tokens"], state["margins"], chunks):
        diff = first_difference(got, margins, ref.tokens, ref.margins)
        assert diff is None or diff.under_margin, diff


def test_malformed_audio_is_one_line_and_exit_2(example_dist, tmp_path):
    from click.testing import CliRunner

    from webbuild.cli import main

    for name, (path, words) in malformed(tmp_path).items():  # in process: the CLI's own handling, faster
        run = CliRunner().invoke(main, ["transcribe", str(example_dist), str(path)])
        assert run.exit_code == 2, (name, run.output)
        lines = run.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {path}: ") and words in lines[0], (name, lines)
        assert not run.stdout, name  # never garbage text


def test_page_shows_one_line_for_malformed_audio(page, tmp_path):
    """The page refuses a malformed file with a visible one-line error naming it, and transcribes nothing."""
    cases = malformed(tmp_path)
    for name in ("nan", "truncated"):
        path, words = cases[name]
        page.evaluate("() => { window.webbuild.error = null; }")  # not the previous case's
        page.set_input_files("#file", str(path))
        wait_for(page, "() => window.webbuild.error || window.webbuild.status === 'done'", 60)
        state = page.evaluate("() => window.webbuild")
        shown = page.inner_text("#error")
        assert state["status"] != "done" and not state["text"], name
        assert shown == f"Error: {path.name}: {words}", shown

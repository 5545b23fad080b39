"""The page's language picker on the trained example, in Chromium on the wasm EP: "automatic" and the model's
languages (runtime.json), the default model.yaml sets; with English forced, the page's tokens equal the Python
reference's with English forced (the same prompt ids: the forced answer prefix after the prompt), and the language
is shown beside the transcript, kept in window.webbuild and named in the .vtt download; live, through Chromium's fake
microphone, the forced language reaches every chunk (finals equal to `transcribe --live` with it forced)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.example_config import EXAMPLE
from webbuild.config import load_config
from webbuild.reference.audio import read_wav
from webbuild.reference.transcribe import load_transcriber
from webbuild.tools.browser import choose, open_site, wait_for
from webbuild.tools.serve import start
from webbuild.tools.verify import live as live_check

DONE = "() => window.webbuild.status === 'done' || window.webbuild.error"


@pytest.fixture(scope="module")
def page(playwright, example_dist):
    srv = start(example_dist, quiet=True)
    browser, page, _ = open_site(playwright, srv, "", webgpu=False, accept_downloads=True)  # the CPU path: wasm
    yield page
    browser.close()
    srv.shutdown()


def transcribe_on_the_page(page, audio: Path, language: str) -> dict:
    page.select_option("#language", language)
    page.set_input_files("#file", str(audio))
    wait_for(page, DONE, 180)
    state = page.evaluate("() => window.webbuild")
    assert state["error"] is None, state["error"]
    return state


def test_the_picker_lists_automatic_and_the_models_languages_on_its_default(page):
    options = page.eval_on_selector_all("#language option", "os => os.map(o => [o.value, o.textContent])")
    languages = load_config(EXAMPLE / "model.yaml").languages
    assert options == [["", "automatic"]] + [[name, name] for name in languages]
    assert page.input_value("#language") == ""  # model.yaml language: auto
    assert page.is_enabled("#language")


def test_forced_english_gives_the_references_tokens_and_shows_the_language(page, example_dist):
    sample = load_config(EXAMPLE / "model.yaml").site.samples[0]
    reference = load_transcriber(example_dist, ep="wasm")  # the graphs the wasm EP runs
    pcm = read_wav(sample.audio)
    automatic = reference.decode(pcm).tokens
    reference.force_language("English")
    forced = reference.decode(pcm).tokens
    assert forced != automatic  # forced, the language tag is the prompt's, not the answer's

    state = transcribe_on_the_page(page, sample.audio, "English")
    assert state["tokens"] == [forced]
    assert (state["text"], state["language"]) == (sample.text, "English")
    assert page.inner_text("#language-shown") == "Language: English"
    with page.expect_download() as dl:
        page.click("#save-vtt")
    assert Path(dl.value.path()).read_text(encoding="utf-8").startswith("WEBVTT\n\nNOTE language: English\n\n")

    state = transcribe_on_the_page(page, sample.audio, "")  # automatic: the model names it
    assert state["tokens"] == [automatic]
    assert (state["text"], state["language"]) == (sample.text, "English")
    assert page.inner_text("#language-shown") == "Language: English"


def test_live_with_a_forced_language_gives_the_references_tokens(playwright, example_dist, tmp_path):
    sample = load_config(EXAMPLE / "model.yaml").site.samples[0]
    wav, played, _ = live_check.make_audio([sample.audio], tmp_path)
    srv = start(example_dist, quiet=True)
    try:
        run = live_check.drive(playwright, choose(), f"{srv.url}?ep=wasm", wav, len(played) / 16000, 300,
                               language="English")
    finally:
        srv.shutdown()
    assert run.error is None, run.error
    reference = load_transcriber(example_dist, ep="wasm")
    captured = live_check.capture_wav(run, tmp_path)
    automatic = [c.decoded.tokens for c in reference.decode_live(captured)]
    reference.force_language("English")
    want = [c.decoded.tokens for c in reference.decode_live(captured)]
    finals = [u["tokens"] for u in run.state["updates"] if u["final"]]
    # the page's capture, not the file played (a loaded machine may drop frames): forced, its tokens, not automatic's
    assert finals == want and any(want) and want != automatic

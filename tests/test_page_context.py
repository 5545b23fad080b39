"""The page's context field on the trained example, in Chromium on the wasm EP: the worker tokenises the visitor's
text itself (runtime/bpe.js) into the system message, and the page's tokens equal the Python reference's with the
same context; a context over the prompt's budget is one clear error, and the page transcribes after it. A build
whose model.yaml sets a context starts the field on it, and the page and `webbuild transcribe` use it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import built_once
from tests.example_config import EXAMPLE, write_example_config
from tests.vad_audio import NAME_CONTEXT
from tests.vad_audio import name_clip as write_name_clip
from webbuild.config import load_config
from webbuild.reference.transcribe import load_transcriber
from webbuild.tools.browser import open_site, wait_for
from webbuild.tools.serve import start

DONE = "() => window.webbuild.status === 'done' || window.webbuild.error"
CONTEXT = NAME_CONTEXT  # a rare name the clip says (name_clip), which the model spells only when given it


@pytest.fixture(scope="module")
def name_clip(tmp_path_factory) -> Path:
    return write_name_clip(tmp_path_factory.mktemp("name") / "name.wav")


@pytest.fixture(scope="module")
def page(playwright, example_dist):
    yield from wasm_page(playwright, example_dist)


@pytest.fixture(scope="module")
def dist_with_context(tmp_path_factory) -> Path:
    """The example built with model.yaml `context: CONTEXT` (without its adapter: fewer files)."""
    return built_once(tmp_path_factory, "example-with-context",
                      lambda folder: (write_example_config(folder, adapters=[], context=CONTEXT),)).dist


def wasm_page(playwright, dist: Path):
    """The site's page on the CPU path (wasm), its model ready; closed after."""
    srv = start(dist, quiet=True)
    browser, page, _ = open_site(playwright, srv, "", webgpu=False)
    yield page
    browser.close()
    srv.shutdown()


def transcribe_on_the_page(page, audio, context: str) -> dict:
    page.fill("#context", context)
    page.set_input_files("#file", str(audio))
    wait_for(page, DONE, 180)
    return page.evaluate("() => window.webbuild")


def test_the_field_is_shown_on_model_yamls_default(page):
    assert page.is_visible("#context") and page.is_enabled("#context")
    assert page.input_value("#context") == ""  # model.yaml sets no context


def test_a_context_gives_the_references_tokens(page, example_dist, name_clip):
    reference = load_transcriber(example_dist, ep="wasm")  # the graphs the wasm EP runs
    plain = [c.tokens for c in reference.decode_file(name_clip)]  # cut into chunks as the page cuts them
    reference.give_context(CONTEXT)
    with_context = reference.decode_file(name_clip)
    assert [c.tokens for c in with_context] != plain  # the context reached the prompt: the name is spelled otherwise

    state = transcribe_on_the_page(page, name_clip, CONTEXT)
    assert state["error"] is None, state["error"]
    assert state["tokens"] == [c.tokens for c in with_context] and state["text"] == reference.file_text(with_context)

    state = transcribe_on_the_page(page, name_clip, "")  # cleared: the plain prompt again
    assert state["error"] is None and state["tokens"] == plain


def test_a_context_with_a_forced_language_gives_the_references_tokens(page, example_dist, name_clip):
    """Both in one prompt: the context in the system message, the language's answer prefix after the suffix."""
    reference = load_transcriber(example_dist, ep="wasm")
    reference.force_language("English")
    forced = [c.tokens for c in reference.decode_file(name_clip)]
    reference.give_context(CONTEXT)
    both = [c.tokens for c in reference.decode_file(name_clip)]
    assert both != forced
    page.select_option("#language", "English")
    try:
        state = transcribe_on_the_page(page, name_clip, CONTEXT)
    finally:
        page.select_option("#language", "")
    assert state["error"] is None and state["tokens"] == both and state["language"] == "English"


def test_a_context_over_the_budget_is_one_clear_error(page, example_dist):
    sample = load_config(EXAMPLE / "model.yaml").site.samples[0]
    codec = load_transcriber(example_dist, ep="wasm").codec
    long = " ".join(["word"] * 200)
    tokens = len(codec.context_prefix(long)) - len(codec.prefix)
    state = transcribe_on_the_page(page, sample.audio, long)
    assert state["error"] == (f"the context text is {tokens} tokens, over the 96 the prompt has room for (the "
                              "longest chunk's prompt and answer must fit the decoder's positions); shorten it")
    assert page.inner_text("#error") == f"Error: {state['error']}"
    state = transcribe_on_the_page(page, sample.audio, "")
    assert state["error"] is None and state["text"] == sample.text


def test_model_yamls_context_is_the_fields_default_and_the_clis(playwright, dist_with_context, name_clip):
    reference = load_transcriber(dist_with_context, ep="wasm")
    assert reference.context == CONTEXT  # the site's default
    chunks = reference.decode_file(name_clip)
    expected = [c.tokens for c in chunks]
    reference.give_context("")
    assert [c.tokens for c in reference.decode_file(name_clip)] != expected  # the default is in the prompt
    for page in wasm_page(playwright, dist_with_context):
        assert page.input_value("#context") == CONTEXT
        page.set_input_files("#file", str(name_clip))
        wait_for(page, DONE, 180)
        state = page.evaluate("() => window.webbuild")
        assert state["error"] is None and state["tokens"] == expected
    run = subprocess.run([str(Path(".venv/bin/webbuild").resolve()), "transcribe", str(dist_with_context),
                          str(name_clip), "--json"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    row = json.loads(run.stdout)
    assert row["context"] == CONTEXT and row["text"] == reference.file_text(chunks)

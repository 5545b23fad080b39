"""The graph names are written once (webbuild.site.contract.IO): renamed there, the build writes the new
names into every graph and into runtime.json, and the page's runtime and the Python reference read them
from the site, so the site still transcribes: on wasm, and on WebGPU through the captured decode steps
(whose next_token output and KV inputs are renamed too)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from tests.example_config import EXAMPLE, sample_text, write_example_config
from webbuild.config import load_config
from webbuild.pipeline.runner import run_build
from webbuild.reference.audio import read_wav
from webbuild.reference.transcribe import load_transcriber
from webbuild.site.contract import IO, RUNTIME_FILE
from webbuild.site.manifest import load_manifest, reassemble
from webbuild.tools.browser import open_site, wait_for

RENAMED = {"past_key": "cache_in.%d.k", "past_value": "cache_in.%d.v", "present_key": "cache_out.%d.k",
           "present_value": "cache_out.%d.v", "next_token": "chosen_token"}
SAMPLE = EXAMPLE / "samples" / "sample-1.wav"  # the page's #sample-0


def test_model_yaml_accepts_the_contract_variants():
    """config.py sits beside site/ in the layers, so it spells the variants itself; they must agree."""
    from typing import get_args

    from webbuild.config import BuildConfig
    from webbuild.site.contract import VARIANTS

    (allowed,) = get_args(BuildConfig.model_fields["variants"].annotation)
    assert set(get_args(allowed)) == set(VARIANTS)


@pytest.fixture(scope="module")
def renamed_site(tmp_path_factory) -> Path:
    """The example built with RENAMED in the contract; the contract is back as it was afterwards."""
    work = tmp_path_factory.mktemp("renamed")
    with pytest.MonkeyPatch.context() as patch:
        for key, name in RENAMED.items():
            patch.setattr(IO, key, name)
        run_build(load_config(write_example_config(work)), work / "dist")
    assert IO.next_token == "next_token"
    return work / "dist"


def site_file(dist: Path, name: str, tmp_path: Path) -> Path:
    reassemble(dist / "model", load_manifest(dist / "model"), name, tmp_path / name)
    return tmp_path / name


def graph_io(path: Path) -> set[str]:
    g = onnx.load(path, load_external_data=False).graph
    return {v.name for v in [*g.input, *g.output]}


def test_the_built_graphs_and_runtime_json_carry_the_new_names(renamed_site, tmp_path):
    manifest = load_manifest(renamed_site / "model")
    runtime = json.loads(site_file(renamed_site, RUNTIME_FILE, tmp_path).read_text())
    assert {k: runtime["io"][k] for k in RENAMED} == RENAMED
    layers = runtime["decoder"]["num_layers"]
    kv = {t % i for t in RENAMED.values() if "%d" in t for i in range(layers)}
    for variant, entry in manifest["variants"].items():
        for role in ("decoder", "decoder_step", "decoder_lora", "decoder_lora_step", "decoder_wasm"):
            if role in entry:
                names = graph_io(site_file(renamed_site, entry[role], tmp_path))
                assert kv <= names and not any(n.startswith(("past_key_values.", "present.")) for n in names), role
        step = graph_io(site_file(renamed_site, entry["decoder_step"], tmp_path))
        assert "chosen_token" in step and "next_token" not in step, variant


def test_the_python_reference_reads_the_sites_names(renamed_site):
    """load_transcriber (load_site) takes the names from the site's runtime.json (the contract is unpatched here)."""
    ref = load_transcriber(renamed_site)
    assert ref.transcribe(read_wav(SAMPLE)) == sample_text(0)


@pytest.mark.parametrize("ep, new_tokens", [("wasm", 64), pytest.param("webgpu", 4, marks=pytest.mark.slow)])
def test_the_page_transcribes_with_the_new_names(playwright, renamed_site, ep, new_tokens):
    """wasm: the whole sample; WebGPU (SwiftShader, ~1 token/s here): a few tokens, through graph capture."""
    from webbuild.tools.serve import start

    expected = load_transcriber(renamed_site).generate(read_wav(SAMPLE), new_tokens)
    srv = start(renamed_site, quiet=True)
    browser, page, log = open_site(playwright, srv, f"?ep={ep}&max_new_tokens={new_tokens}", webgpu=ep == "webgpu")
    try:
        state = page.evaluate("() => window.webbuild")
        assert state["status"] == "ready" and state["info"]["ep"] == ep, state
        if ep == "webgpu":
            assert state["info"]["decode"] == "captured", state["info"]
        page.click("#sample-0")
        wait_for(page, "() => window.webbuild.status === 'done' || window.webbuild.error", 400)
        state = page.evaluate("() => window.webbuild")
        assert state["error"] is None and state["tokens"] == [expected], state
        assert not log["errors"], log["errors"]
    finally:
        browser.close()
        srv.shutdown()

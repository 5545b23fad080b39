"""The embedded example (examples/tiny-asr, a trained tiny Qwen3-ASR) as a site: every sample clip
transcribed in headless Chromium, on SwiftShader WebGPU and on the wasm fallback, gives exactly the
text of the Python reference on the same built graphs (and the clip's transcript); with its LoRA adapter
picked on the page, the tokens of the reference with that adapter on, and with none picked again, the
first tokens exactly."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import onnx
import pytest

from tests.example_config import example_config, write_example_config
from tests.test_site import needs_chromium, playwright, reference_for  # noqa: F401 (fixture)
from webbuild.build.runner import run_build
from webbuild.config import load_config
from webbuild.reference.audio import read_wav
from webbuild.site.contract import SAMPLES_FILE
from webbuild.tools.browser import open_site, wait_for

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny-asr"



@pytest.fixture(scope="module")
def example_site(tmp_path_factory):
    """examples/tiny-asr/model.yaml built as is (split source, fused by the build), under /demo/; with the
    samples of its samples.json, each with its clip's path in the built folder."""
    work = tmp_path_factory.mktemp("example")
    cfg = example_config()
    cfg["site"]["base_path"] = "/demo/"
    write_example_config(work, site=cfg["site"])
    run_build(load_config(work / "model.yaml"), work / "dist")
    samples = json.loads((work / "dist" / SAMPLES_FILE).read_text())["samples"]
    assert [s["text"] for s in samples] == [s["text"] for s in cfg["site"]["samples"]]
    return work, [{**s, "audio": work / "dist" / s["src"]} for s in samples]


@pytest.fixture(scope="module")
def expected(example_site):
    """Per sample: (the Python reference's text on the site's own graphs, the clip's transcript)."""
    work, samples = example_site
    ref = reference_for(work)
    return [(ref.transcribe(read_wav(s["audio"])), s["text"]) for s in samples]


def test_python_reference_runs_both_variants_webgpu_graphs(example_site, expected, tmp_path):
    """The shipped decoders hold the Q/K norms inside GroupQueryAttention (the WebGPU form), which
    onnxruntime CPU refuses; the reference takes them back out and gets every sample right."""
    from webbuild.reference.transcribe import load_transcriber
    from webbuild.site.manifest import load_manifest, reassemble

    work, samples = example_site
    manifest = load_manifest(work / "dist" / "model")
    report = json.loads((work / "dist" / "build-report.json").read_text())
    for variant in ("fp16", "fp32"):
        name = manifest["variants"][variant]["decoder"]
        reassemble(work / "dist" / "model", manifest, name, tmp_path / name)
        ops = [n.op_type for n in onnx.load(str(tmp_path / name), load_external_data=False).graph.node]
        assert ops.count("SimplifiedLayerNormalization") == 1 and ops.count("GroupQueryAttention") == 4, variant
        assert report["variants"][variant]["decoder"]["ops"] == dict(Counter(ops)), variant  # what ships
        ref = load_transcriber(work / "dist", variant)
        assert [ref.transcribe(read_wav(s["audio"])) for s in samples] == [t for _, t in expected], variant


def transcribe_all(page, samples: list[dict]) -> list[str]:
    texts = []
    for sample in samples:
        # every text the transcript shows on the way, to see it stream token by token
        page.evaluate("""() => { window.seen = []; new MutationObserver(() => window.seen.push(
            document.getElementById('transcript').textContent)).observe(document.getElementById('transcript'),
            { childList: true, characterData: true, subtree: true }); }""")
        page.click(f"#{sample['id']}")
        wait_for(page, "() => window.webbuild.status === 'done' || window.webbuild.error", 400)
        state = page.evaluate("() => window.webbuild")
        assert state["error"] is None, state["error"]
        seen = [t for t in page.evaluate("() => window.seen") if t]
        assert len(set(seen)) >= len(state["text"].split()), seen  # at least one update per word
        assert all(state["text"].startswith(t.rstrip()) for t in seen), seen  # growing prefixes of the result
        texts.append(state["text"])
    return texts


@needs_chromium
@pytest.mark.parametrize("webgpu", [pytest.param(True, marks=pytest.mark.slow), False], ids=["webgpu", "wasm"])
def test_example_site_transcribes_its_samples(playwright, example_site, expected, webgpu):
    from webbuild.tools.serve import start

    work, samples = example_site
    srv = start(work / "dist", quiet=True, base_path="/demo/")
    # ?ep=webgpu: on this machine's SwiftShader the page's own choice is wasm
    browser, page, log = open_site(playwright, srv, "?ep=webgpu" if webgpu else "", webgpu=webgpu)
    try:
        info = page.evaluate("() => window.webbuild.info")
        assert info["ep"] == ("webgpu" if webgpu else "wasm")
        texts = transcribe_all(page, samples)
        assert texts == [reference for reference, _ in expected]
        assert texts == [transcript for _, transcript in expected]  # the trained model gets them all right
        assert page.inner_text("#m-rtf") not in ("", "–")
        origin = srv.url.split("/demo/")[0]
        assert all(u.startswith(origin + "/demo/") for u in log["requests"])
    finally:
        browser.close()
        srv.shutdown()


def page_tokens(page, sample: dict) -> list[int]:
    """The page's greedy tokens of one sample clip (one chunk)."""
    page.click(f"#{sample['id']}")
    wait_for(page, "() => window.webbuild.status === 'done' || window.webbuild.error", 400)
    state = page.evaluate("() => window.webbuild")
    assert state["error"] is None, state["error"]
    [tokens] = state["tokens"]
    return tokens


def pick_lora(page, name: str | None) -> None:
    """The picker set to adapter `name` (None: the base model), the worker's switch waited for."""
    page.select_option("#lora", name or "")
    wait_for(page, f"() => window.webbuild.lora === {json.dumps(name)} || window.webbuild.error", 120)
    assert page.evaluate("() => window.webbuild.error") is None


@pytest.fixture(scope="module")
def lora_expected(example_site):
    """Per sample: the Python reference's tokens with no adapter and with klatt (webbuild transcribe --adapter)."""
    from webbuild.reference.transcribe import load_transcriber

    work, samples = example_site
    refs = {name: load_transcriber(work / "dist", adapter=name) for name in (None, "klatt")}
    return {name: [ref.generate(read_wav(s["audio"])) for s in samples] for name, ref in refs.items()}


@needs_chromium
@pytest.mark.parametrize("webgpu", [pytest.param(True, marks=pytest.mark.slow), False], ids=["webgpu", "wasm"])
def test_adapter_picker_on_and_off_gives_the_references_tokens(playwright, example_site, lora_expected, webgpu):
    """The page lists the build's adapter in a labelled picker; each transcription runs with the adapter
    picked before it: none (the base graphs), klatt (the adapted graphs, its weights written into the inputs
    made at load), none again (the first tokens exactly). On SwiftShader WebGPU (about a token a second)
    the sample the adapter changes and one it leaves alone; on wasm every sample."""
    from webbuild.tools.serve import start

    work, samples = example_site
    picked = [0, 3] if webgpu else range(len(samples))
    assert lora_expected["klatt"][3] != lora_expected[None][3]  # the adapter changes sample 4's transcript
    srv = start(work / "dist", quiet=True, base_path="/demo/")
    browser, page, _ = open_site(playwright, srv, "?ep=webgpu" if webgpu else "", webgpu=webgpu)
    try:
        info = page.evaluate("() => window.webbuild.info")
        assert info["ep"] == ("webgpu" if webgpu else "wasm") and info["loraAdapters"] == ["klatt"]
        assert info["lora"] is None and (info["decode"] == "captured") == webgpu
        assert page.is_visible("#lora") and page.inner_text("label[for=lora]") == "Adapter"
        assert page.eval_on_selector_all("#lora option", "os => os.map((o) => [o.value, o.textContent])") == [
            ["", "none (base model)"], ["klatt", "klatt"]]
        runs = {}
        for run, name in (("off", None), ("on", "klatt"), ("off again", None)):
            if run != "off":
                pick_lora(page, name)
            runs[run] = [page_tokens(page, samples[i]) for i in picked]
            assert page.evaluate("() => window.webbuild.doneLora") == name
            assert runs[run] == [lora_expected[name][i] for i in picked], run
        assert runs["off again"] == runs["off"] != runs["on"]
    finally:
        browser.close()
        srv.shutdown()

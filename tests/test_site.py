"""The built site: its files, and transcription in headless Chromium (WebGPU on SwiftShader, and
the wasm fallback) against the Python reference on the same graphs."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from webbuild.config import load_config
from webbuild.pipeline.runner import run_build
from webbuild.reference.audio import read_wav, write_wav
from webbuild.reference.prompt import build_prompt
from webbuild.site.contract import ORT_DIR, ORT_MODULES, ORT_WASM, SAMPLES_FILE
from webbuild.site.manifest import load_manifest, verify_manifest
from webbuild.tools.browser import choose, launch, open_page, open_site, wait_for

MAX_BYTES = 4 * 2**20  # small, so the decoder data and ORT's wasm arrive in several shards
NO_GPU = "This browser can't use the GPU here, so the model runs on the CPU (slower)."  # the notice without WebGPU
NEW_TOKENS = 6  # SwiftShader decodes about one token a second: keep browser runs short


def build_site(root: Path, source: Path, fusion: bool) -> Path:
    """A tiny site built from a merged-layout `source`, with one sample clip, under /demo/."""
    t = np.arange(int(16000 * 1.2)) / 16000
    noise = np.random.default_rng(1).standard_normal(t.size)
    write_wav(root / "clip.wav", 0.3 * np.sin(2 * np.pi * 330 * t) * np.exp(-2 * t) + 0.02 * noise)
    (root / "model.yaml").write_text(json.dumps({
        "name": "tiny-test", "source": {"layout": "merged", "dir": str(source)},
        "shard": {"max_bytes": MAX_BYTES}, "fusion": {"enabled": fusion},
        "site": {"title": "Tiny test", "base_path": "/demo/", "samples": [{"audio": "clip.wav", "text": "a tone"}]},
        "speech_detection": False,  # the clip is a tone, no speech: the runtime's path, every chunk decoded
    }))
    cfg = load_config(root / "model.yaml")
    run_build(cfg, root / "dist")
    return root


@pytest.fixture(scope="session")
def site(zoo_export, tmp_path_factory):
    """The exported (decomposed) decoder as is: fusion off."""
    return build_site(tmp_path_factory.mktemp("site"), zoo_export("merged"), fusion=False)


@pytest.fixture(scope="session")
def fused_site(zoo_export, tmp_path_factory):
    """The same model through the build's fuse stage (GroupQueryAttention inside)."""
    return build_site(tmp_path_factory.mktemp("fused"), zoo_export("merged"), fusion=True)


def reference_for(site_root: Path):
    """The Python reference Transcriber on the graphs reassembled from a site's own shards."""
    from webbuild.reference.transcribe import load_transcriber

    return load_transcriber(site_root / "dist")


@pytest.fixture(scope="session")
def reference(site):
    return reference_for(site)


# ---------------------------------------------------------------- build output


def test_every_file_within_the_shard_limit_and_no_loose_model_files(site):
    dist = site / "dist"
    files = [p for p in dist.rglob("*") if p.is_file()]
    assert max(p.stat().st_size for p in files) <= MAX_BYTES
    assert not [p for p in files if p.suffix in (".onnx", ".data", ".wasm") or p.name == "embed_tokens.bin"]
    assert verify_manifest(dist / "model") == []
    report = json.loads((dist / "build-report.json").read_text())
    manifest = load_manifest(dist / "model")
    assert report["files"]["shards"] == len(manifest["shards"]) > 8
    assert report["files"]["max_file_bytes"] <= MAX_BYTES
    wasm = manifest["files"][ORT_WASM]
    assert len(wasm["parts"]) == 7  # 25.5 MiB in 4 MiB shards


def test_site_files(site):
    dist = site / "dist"
    for name in ("index.html", "app.js", "worker.js", "style.css", "theme.css", "runtime/loader.js",
                 "runtime/load-worker.js", "runtime/site.js",
                 *(f"{ORT_DIR}/{m}" for m in ORT_MODULES), "samples/00-clip.wav", "_headers"):
        assert (dist / name).is_file(), name
    html = (dist / "index.html").read_text()
    assert "<title>Tiny test</title>" in html
    assert json.loads((dist / SAMPLES_FILE).read_text()) == {
        "name": "tiny-test", "base_path": "/demo/", "max_wer": 0.0, "min_decode_tokens_per_s": {},
        "samples": [{"id": "sample-0", "src": "samples/00-clip.wav", "text": "a tone", "label": "clip"}]}
    assert "<script>" not in html and "style=" not in html  # nothing inline: the CSP allows only files
    headers = (dist / "_headers").read_text()
    assert "/demo/*\n" in headers
    assert "/demo/model/shards/*\n  Cache-Control: public, max-age=31536000, immutable" in headers
    assert "default-src 'self'" in headers


def test_runtime_config_and_token_table(site, zoo_export):
    from webbuild.pipeline.assemble import token_table

    src = zoo_export("merged")
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    manifest = load_manifest(site / "dist" / "model")
    part = manifest["files"]["runtime.json"]["parts"][0]
    rt = json.loads((site / "dist" / "model" / part["shard"]).read_bytes())
    prompt = build_prompt(tok, 5)
    assert rt["prompt"]["prefix"] + [rt["prompt"]["audio_pad"]] * 5 + rt["prompt"]["suffix"] == prompt.ids
    table = token_table(tok)
    count = int.from_bytes(table[:4], "little")
    offsets = np.frombuffer(table[4:4 * (count + 2)], "<u4")
    data = table[4 * (count + 2):]
    ids = np.random.default_rng(0).integers(0, count, size=(200, 12))
    for seq in ids:
        raw = b"".join(data[offsets[i]:offsets[i + 1]] for i in seq)
        assert raw.decode("utf-8", "replace") == tok.decode(seq.tolist(), skip_special_tokens=False)


def test_runtime_json_carries_the_contract_names(site, fused_site):
    """runtime.json names the files the JS looks up as webbuild.site.contract does (file roles, the decode
    table, onnxruntime-web's module and wasm), and every file role of a manifest variant is one of them."""
    from webbuild.site.contract import FILE_ROLES, IO, ORT_MODULE, RUNTIME_FILE, TOKENS_FILE, VARIANTS

    known = {role for table in FILE_ROLES.values() for role in table.values()}
    for built in (site, fused_site):
        dist = built / "dist"
        manifest = load_manifest(dist / "model")
        rt = json.loads((dist / "model" / manifest["files"][RUNTIME_FILE]["parts"][0]["shard"]).read_bytes())
        assert rt["files"] == {"tokens": TOKENS_FILE, "ort_module": f"{ORT_DIR}/{ORT_MODULE}", "ort_wasm": ORT_WASM}
        assert rt["roles"] == FILE_ROLES and rt["io"] == IO.names() and rt["variants"] == VARIANTS
        assert {TOKENS_FILE, ORT_WASM} <= set(manifest["files"]) and (dist / rt["files"]["ort_module"]).is_file()
        for name, entry in manifest["variants"].items():
            assert {k: entry[k] for k in VARIANTS[name]} == VARIANTS[name]  # dtype, requires, providers
            # wasm: webbuild.pipeline.wasm_budget; weights: the shared-weights forms' table (forms.shared_weights)
            roles = set(entry) - {"files", "wasm", "weights", *VARIANTS[name]}
            assert roles <= known and sorted(entry[r] for r in roles) == sorted(entry["files"]), name
            assert ("weights" in entry) == ("decoder_shared" in entry), name


def test_wasm_twin_decoder_matches_the_quantized_decoder(fused_site, tmp_path):
    """The WebGPU decoder has the Q/K norms inside GroupQueryAttention; the wasm fallback's graph has
    them explicit and GatherBlockQuantized / MatMulNBits spelt in standard ops (webbuild.forms.wasm_twin).
    On onnxruntime CPU the WebGPU graph with its norms taken back out (the Python reference's form)
    gives the twin's greedy token, and its logits within the int8 rounding of the activations that
    CPU's MatMulNBits (accuracy level 4) does and the twin's float weights do not."""
    import onnxruntime as ort

    from webbuild.reference.transcribe import cpu_form
    from webbuild.site.manifest import reassemble

    manifest = load_manifest(fused_site / "dist" / "model")
    roles = manifest["variants"]["fp32"]
    assert "decoder_wasm" in roles and roles["decoder_wasm"] in roles["files"]
    for role in ("decoder", "decoder_data", "decoder_wasm"):
        reassemble(fused_site / "dist" / "model", manifest, roles[role], tmp_path / roles[role])
    webgpu, wasm = onnx_ops(tmp_path / roles["decoder"]), onnx_ops(tmp_path / roles["decoder_wasm"])
    assert webgpu.count("SimplifiedLayerNormalization") == 1 and wasm.count("SimplifiedLayerNormalization") == 9
    assert "GatherBlockQuantized" in webgpu and not {"GatherBlockQuantized", "MatMulNBits"} & set(wasm)
    graphs = [ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
              for path in (cpu_form(tmp_path / roles["decoder"]), tmp_path / roles["decoder_wasm"])]
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 600, (1, 9)),
             "audio_features": rng.standard_normal((1, 4, 256)).astype(np.float32),
             "audio_offset": np.array([2]), "attention_mask": np.ones((1, 9), np.int64)}
    feeds |= {i.name: np.zeros((1, 2, 0, 64), np.float32) for i in graphs[0].get_inputs() if i.name.startswith("past")}
    a, b = (g.run(["logits"], feeds)[0][0, -1] for g in graphs)
    assert np.argmax(a) == np.argmax(b) and np.max(np.abs(a - b)) / np.ptp(a) < 0.02


def test_wasm_twin_encoder_matches_the_int4_encoder(fused_site, tmp_path):
    """The int4 encoder's wasm twin (webbuild.forms.wasm_twin): no MatMulNBits, the same weights file, and
    the same features on onnxruntime CPU up to float rounding (the encoder's int4 is accuracy level
    0: CPU computes it in float too)."""
    import onnxruntime as ort

    from webbuild.site.manifest import reassemble

    manifest = load_manifest(fused_site / "dist" / "model")
    roles = manifest["variants"]["fp32"]
    assert roles.get("encoder_wasm") in roles["files"]
    for role in ("encoder", "encoder_data", "encoder_wasm"):
        reassemble(fused_site / "dist" / "model", manifest, roles[role], tmp_path / roles[role])
    assert "MatMulNBits" in onnx_ops(tmp_path / roles["encoder"])
    assert "MatMulNBits" not in onnx_ops(tmp_path / roles["encoder_wasm"])
    pcm = {"pcm": (np.random.default_rng(0).standard_normal((1, 16000)) * 0.1).astype(np.float32)}
    a, b = (ort.InferenceSession(str(tmp_path / roles[r]), providers=["CPUExecutionProvider"]).run(None, pcm)[0]
            for r in ("encoder", "encoder_wasm"))
    err = np.max(np.abs(a - b)) / np.ptp(a)
    print(f"encoder twin vs int4 encoder: {err:.1e} of the range")
    assert a.shape == b.shape and err < 1e-5


@pytest.mark.parametrize("damage", ["manifest", "shard"])
def test_transcribe_on_a_damaged_site_is_one_line_and_exit_code_2(site, tmp_path, damage):
    """A site with an unreadable manifest or a missing shard is the user's to rebuild, not a bug."""
    import shutil

    from click.testing import CliRunner

    from webbuild.cli import main

    dist = tmp_path / "dist"
    shutil.copytree(site / "dist", dist)
    if damage == "manifest":
        (dist / "model" / "manifest.json").write_text("[1, 2]")
    else:
        parts = load_manifest(dist / "model")["files"]["decoder.fp32.onnx.data"]["parts"]
        (dist / "model" / parts[0]["shard"]).unlink()
    result = CliRunner().invoke(main, ["transcribe", str(dist), str(site / "clip.wav")])
    assert result.exit_code == 2, result.output
    assert result.output.count("error:") == 1 and "rebuild the site" in result.output
    assert ("manifest" if damage == "manifest" else parts[0]["shard"].split("/")[-1]) in result.output


def onnx_ops(path: Path) -> list[str]:
    import onnx

    return [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]


def test_theme_contrast_warnings():
    from webbuild.config import Theme
    from webbuild.pipeline.render import contrast_ratio, theme_warnings

    assert round(contrast_ratio("#000000", "#ffffff"), 1) == 21.0
    assert theme_warnings(Theme()) == []  # the defaults are readable
    low = theme_warnings(Theme(accent="#ffdd00", text="#777777", background="#888888"))
    assert len(low) == 2 and "site.theme.text" in low[0] and "accent" in low[1]


# ---------------------------------------------------------------- in the browser


def served(site, **kw):
    from webbuild.tools.serve import start

    return start(site / "dist", quiet=True, base_path="/demo/", **kw)


@contextlib.contextmanager
def site_page(playwright, site, query: str, webgpu: bool):
    """(server, page, request log) of the site opened in Chromium; both closed afterwards."""
    srv = served(site)
    browser, page, log = open_site(playwright, srv, query, webgpu=webgpu)
    try:
        yield srv, page, log
    finally:
        browser.close()
        srv.shutdown()


def transcribe_sample(page) -> dict:
    page.click("#sample-0")
    wait_for(page, "() => window.webbuild.status === 'done' || window.webbuild.error", 400)
    return page.evaluate("() => window.webbuild")


def check_against_reference(state, site, reference):
    pcm = read_wav(site / "clip.wav")
    assert state["error"] is None
    assert state["tokens"] == [reference.generate(pcm, NEW_TOKENS)]
    assert state["text"] == (reference.transcribe(pcm, NEW_TOKENS) or "(no speech recognised)")


def check_metrics(page, state):
    m = state["metrics"]
    assert m["encoder_ms"] > 0 and m["ttft_ms"] >= m["encoder_ms"] and m["prefill_tokens_per_s"] > 0
    assert m["generated_tokens"] == NEW_TOKENS and m["decode_tokens_per_s"] > 0 and m["rtf"] > 0
    assert abs(m["audio_ms"] - 1200) < 1
    assert m["prompt_tokens"] > 31  # more than one prefill run on WebGPU where the warm-up keeps runs of 31
    load = dict(state["info"]["load"])
    assert (load.pop("cache_ms"), load.pop("cache_bytes")) == (0, 0)  # a first visit: nothing from the cache
    # a software GPU's page warms no shape classes (no ?warm=shapes), so nothing runs between its sessions
    assert load.pop("encoder_warmup_ms") == 0 and load.pop("int8_ms") == 0
    # nor checks a long prefill run, nor measures the decode forms (runtime/decode-form.js: not on a software GPU)
    assert load.pop("runs_check_ms") == 0 and load.pop("decode_form_ms") < load["warmup_ms"]
    assert min(load.values()) > 0
    # the load's steps in order: onnxruntime started (runtime/ort-start.js) before the encoder's session, which
    # waited for the start and the encoder's files; each step's times within the load
    steps = state["info"]["loadTimeline"]
    names = [s["step"] for s in steps]
    assert names[:3] == ["onnxruntime start", "encoder files", "encoder session"], names
    assert steps[0]["end_ms"] <= steps[1]["end_ms"] <= steps[2]["start_ms"], steps
    assert all(0 <= s["start_ms"] <= s["end_ms"] <= state["info"]["load"]["total_ms"] + 1 for s in steps), steps
    for key in ("gpu", "runtime", "load", "encoder", "ttft", "prefill", "decode", "rtf"):
        assert page.inner_text(f"#m-{key}") not in ("", "–"), key


def check_same_origin(srv, log):
    origin = srv.url.split("/demo/")[0]
    # blob: URLs of the origin: the page's own object URLs (the chosen clip in its audio player)
    assert log["requests"] and all(u.startswith((origin + "/demo/", f"blob:{origin}/")) for u in log["requests"]), \
        log["requests"]
    assert not [c for c in log["console"] if "Content Security Policy" in c], log["console"]
    assert not log["errors"], log["errors"]


@pytest.mark.parametrize("graph", ["export", "fused", "fused, shared weights"])
def test_webgpu_transcribes_like_the_reference(playwright, graph, site, fused_site):
    """The page on SwiftShader WebGPU gives the reference's tokens: for a source export's graphs, for the fused
    ones, and for the fused ones with the decoder's weights uploaded once and fed to both its sessions as inputs
    (?weights=shared, webbuild/forms/shared_weights.py)."""
    site = site if graph == "export" else fused_site
    reference = reference_for(site)
    if graph != "export":  # the GQA graph prefills in runs the WebGPU kernel gets right
        rt = json.loads(next((site / "dist" / "model" / "shards").glob("runtime.json.*")).read_bytes())
        assert rt["webgpu_prefill_chunk"] == 31
    shared = "&weights=shared" if graph.endswith("shared weights") else ""
    # ?ep=webgpu: SwiftShader is software, where the page would take wasm on its own
    query = f"?ep=webgpu&max_new_tokens={NEW_TOKENS}{shared}"
    with site_page(playwright, site, query, webgpu=True) as (srv, page, log):
        state = page.evaluate("() => window.webbuild")
        assert state["status"] == "ready", state
        assert state["info"]["ep"] == "webgpu" and state["info"]["variant"] == "fp32"  # no shader-f16 here
        assert state["info"]["kvCache"] == "gpu-buffer"
        manifest = json.loads((site / "dist" / "model" / "manifest.json").read_text())
        assert state["info"]["sharedWeights"] == (len(manifest["variants"]["fp32"]["weights"]) if shared else 0)
        if shared:  # both sessions read the uploaded weights: the captured steps too
            assert state["info"]["decode"] == "captured", state["info"]
        assert "swiftshader" in state["info"]["gpu"].lower()
        assert page.is_hidden("#notice")
        state = transcribe_sample(page)
        check_against_reference(state, site, reference)
        check_metrics(page, state)
        assert page.inner_text("#transcript") == state["text"]
        check_same_origin(srv, log)


def test_software_webgpu_gets_wasm_with_a_note_unless_ep_webgpu(playwright, site):
    # this machine's only WebGPU adapter is SwiftShader (software), ~100x slower than wasm here
    with site_page(playwright, site, "?max_new_tokens=2", webgpu=True) as (srv, page, _):
        state = page.evaluate("() => window.webbuild")
        assert state["status"] == "ready", state
        assert state["info"]["ep"] == "wasm" and state["info"]["variant"] == "fp32", state["info"]
        note = page.inner_text("#notice")
        assert page.is_visible("#notice") and note == state["info"]["notice"]
        assert note.startswith("This browser offers only a software imitation of a GPU here (")
        assert "swiftshader" in note.lower()
        assert note.endswith("so the model runs on the CPU. To try it anyway, add ?ep=webgpu to the address.")
        assert "the CPU (WebAssembly)" in page.inner_text("#status")
        forced = page.context.browser.new_page()
        open_page(forced, srv.url + "?ep=webgpu&max_new_tokens=2")
        state = forced.evaluate("() => window.webbuild")
        assert state["status"] == "ready" and state["info"]["ep"] == "webgpu", state
        assert "swiftshader" in state["info"]["gpu"].lower() and forced.is_hidden("#notice")


def test_without_webgpu_falls_back_to_wasm(playwright, site, reference):
    # No COOP/COEP here (as on GitHub Pages), where the site's service worker isolates the page (its threads:
    # tests/test_wasm_threads.py); ?threads=1: single-threaded wasm must work too.
    srv = served(site)
    srv.rules = [(p, [h for h in hs if not h[0].startswith("Cross-Origin")]) for p, hs in srv.rules]
    browser, page, log = open_site(playwright, srv, f"?max_new_tokens={NEW_TOKENS}&threads=1", webgpu=False,
                                   viewport={"width": 360, "height": 740})
    try:
        state = page.evaluate("() => window.webbuild")
        assert state["status"] == "ready", state
        assert state["info"]["ep"] == "wasm" and state["info"]["threads"] == 1 and state["info"]["kvCache"] == "cpu"
        assert page.inner_text("#notice") == NO_GPU
        state = transcribe_sample(page)
        check_against_reference(state, site, reference)
        check_metrics(page, state)
        check_same_origin(srv, log)
        # narrow phone viewport: nothing wider than the screen
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 360
        # denied / missing microphone gives a readable message, not a dead button
        page.click("#mic")
        wait_for(page, "() => !document.getElementById('error').hidden", 20)
        assert any(w in page.inner_text("#error") for w in ("denied", "no microphone", "microphone"))
        assert page.get_attribute("#mic", "aria-pressed") == "false"
    finally:
        browser.close()
        srv.shutdown()


def test_controls_are_labelled_and_keyboard_reachable(playwright, site):
    with site_page(playwright, site, "?ep=wasm&max_new_tokens=2", webgpu=False) as (srv, page, _):
        names = page.evaluate("""() => [...document.querySelectorAll('button, input, select')].map((el) =>
            [el.id, el.labels?.[0]?.textContent || el.textContent || el.getAttribute('aria-label') || ''])""")
        assert all(name.strip() for _, name in names), names
        # a build without LoRA adapters: no adapter picker
        assert page.evaluate("() => window.webbuild.info.loraAdapters") == [] and page.is_hidden("#lora")
        focused = []
        for _ in range(6):
            page.keyboard.press("Tab")
            focused.append(page.evaluate("() => document.activeElement.id"))
        assert {"sample-0", "file", "mic"} <= set(focused), focused
        page.focus("#sample-0")
        page.keyboard.press("Enter")
        wait_for(page, "() => window.webbuild.status === 'done'", 120)
        # the stored model can be removed (Cache API entry of the loader)
        assert "webbuild-tiny-test" in page.evaluate("() => caches.keys()")
        page.click("#clear-cache")
        wait_for(page, "() => document.getElementById('status').textContent.includes('removed')", 20)
        assert "webbuild-tiny-test" not in page.evaluate("() => caches.keys()")


def test_file_upload_any_rate_and_channels(playwright, site, tmp_path):
    # 44.1 kHz stereo, 16-bit: decoded and resampled to 16 kHz mono in the page
    import wave

    t = np.arange(int(44100 * 0.8)) / 44100
    left, right = np.sin(2 * np.pi * 220 * t), np.sin(2 * np.pi * 440 * t)
    frames = (np.stack([left, right], 1) * 0.3 * 32767).astype("<i2")
    path = tmp_path / "stereo-44k.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2), w.setsampwidth(2), w.setframerate(44100), w.writeframes(frames.tobytes())
    with site_page(playwright, site, "?ep=wasm&max_new_tokens=2", webgpu=False) as (srv, page, _):
        page.set_input_files("#file", str(path))
        wait_for(page, "() => window.webbuild.status === 'done' || window.webbuild.error", 120)
        state = page.evaluate("() => window.webbuild")
        assert state["error"] is None and abs(state["metrics"]["audio_ms"] - 800) < 1
        assert len(state["tokens"][0]) == 2
        page.set_input_files("#file", {"name": "junk.wav", "mimeType": "audio/wav", "buffer": b"not audio at all"})
        wait_for(page, "() => window.webbuild.error", 60)
        assert "could not be decoded" in page.inner_text("#error")
        assert page.is_enabled("#sample-0")  # the page recovers from a bad file


def test_microphone_recording(playwright, site):
    # Chromium's fake capture device (a beeping tone) stands in for a microphone
    srv = served(site)
    browser = launch(playwright, choose(), webgpu=False, extra=[
        "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream"])
    try:
        context = browser.new_context(permissions=["microphone"])
        page = context.new_page()
        page.goto(srv.url + "?ep=wasm&max_new_tokens=2")
        wait_for(page, "() => window.webbuild?.status === 'ready'", 120)
        page.click("#mic")
        wait_for(page, "() => document.getElementById('mic').ariaPressed === 'true' || window.webbuild.error", 20)
        assert page.evaluate("() => window.webbuild.error") is None and page.is_disabled("#sample-0")
        time.sleep(1.5)
        page.click("#mic")
        wait_for(page, "() => window.webbuild.status === 'done' || window.webbuild.error", 120)
        state = page.evaluate("() => window.webbuild")
        assert state["error"] is None and 1000 < state["metrics"]["audio_ms"] < 3000, state
        assert page.get_attribute("#mic", "aria-pressed") == "false"
    finally:
        browser.close()
        srv.shutdown()

"""The page's controls on the trained example, in Chromium on the wasm EP: the sample buttons with their words and
the chosen clip in the audio element, drag-and-drop, copy, the transcript saved as text and as SRT / WebVTT
subtitles cued by the chunks the reference cuts, Retry after a failed load, the plain notice, the processor
and the LoRA adapter named apart, each adapter's description from model.yaml, and the loading steps named by
what they do on the CPU. Long files and failures (issue 47): a long file's chunk progress and Cancel, the segments
with their start times seeking the player, a failed load that names the model's file and drops its stale retry
notice, the live rows hidden until live transcription ran, a visit served from the cache said so, a file that cannot
be decoded taking its player away, issue 47's bad files (corrupt, truncated, header-only, a PNG, 4 GHz, NaN,
zero-length, A-law) each one message with no player left and no console error, and a full storage (a tiny quota) that
loads the model all the same."""

from __future__ import annotations

import base64
import json
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from tests.example_config import EXAMPLE
from tests.test_resample import wav_bytes
from tests.test_site import NO_GPU
from webbuild.config import load_config
from webbuild.reference.audio import read_wav, write_wav
from webbuild.reference.transcribe import load_transcriber
from webbuild.site.contract import RUNTIME_FILE, SAMPLES_FILE
from webbuild.site.manifest import load_manifest
from webbuild.tools.browser import choose, hide_webgpu, launch, open_page, wait_for, watch
from webbuild.tools.serve import start

DONE = "() => window.webbuild.status === 'done' || window.webbuild.error"
# every text the status line shows while the model loads, with whether the bar was indeterminate then; and the
# blob of each object URL the page makes (the CSP lets the page fetch none: connect-src 'self')
STATUS_LOG = """
window.blobs = {};
const makeUrl = URL.createObjectURL;
URL.createObjectURL = (blob) => { const url = makeUrl(blob); window.blobs[url] = blob; return url; };
window.statusLog = [];
document.addEventListener('DOMContentLoaded', () => {
  const status = document.getElementById('status'), bar = document.getElementById('progress');
  new MutationObserver(() => window.statusLog.push([status.textContent, bar.matches(':indeterminate')]))
    .observe(status, { childList: true, characterData: true, subtree: true });
});
"""


@pytest.fixture(scope="module")
def server(example_dist):
    srv = start(example_dist, quiet=True)
    yield srv
    srv.shutdown()


@pytest.fixture(scope="module")
def browser(playwright):
    browser = launch(playwright, choose(), webgpu=False)
    yield browser
    browser.close()


def new_page(browser, **context):
    """A page in a fresh context without WebGPU (the CPU path), logging the status line."""
    ctx = browser.new_context(**context)
    hide_webgpu(ctx)
    ctx.add_init_script(STATUS_LOG)
    page = ctx.new_page()
    watch(page)
    return page


@pytest.fixture(scope="module")
def page(browser, server):
    page = new_page(browser, accept_downloads=True, permissions=["clipboard-read", "clipboard-write"])
    open_page(page, server.url)
    yield page
    page.context.close()


def clip_bytes(page) -> bytes:
    """The bytes behind the audio element's src (an object URL)."""
    b64 = page.evaluate("""async () => {
        const bytes = new Uint8Array(await window.blobs[document.getElementById('clip').src].arrayBuffer());
        let text = '';
        for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
        return btoa(text);
    }""")
    return base64.b64decode(b64)


def test_cpu_path_is_named_plainly(page):
    state = page.evaluate("() => window.webbuild")
    assert state["status"] == "ready" and state["info"]["ep"] == "wasm", state
    assert page.inner_text("#notice") == NO_GPU
    # the processor and the LoRA adapter named apart
    assert page.inner_text("#metrics dt >> nth=0") == "Runs on" and page.inner_text("#m-gpu") == "the CPU (no GPU used)"
    assert page.inner_text("label[for=lora]") == "Voice adapter (LoRA)"
    # the loading steps as the CPU runs them: nothing about GPU shaders; the steps without a fraction move
    log = page.evaluate("() => window.statusLog")
    texts = [t for t, _ in log]
    steps = ["Step 1 of 3: downloading the model…", "Step 2 of 3: preparing the model for the CPU…",
             "Step 3 of 3: warming up (a first short run on the CPU)…"]
    assert [t for t in dict.fromkeys(texts) if t.startswith("Step")] == steps, texts
    assert not [t for t in texts if "GPU" in t], texts
    assert all(indeterminate for t, indeterminate in log if t in steps[1:]), log
    assert page.inner_text("#status") == "Ready: the fp32 model runs on the CPU (WebAssembly)."


def test_adapter_picker_says_what_each_adapter_is_for(page, example_dist):
    described = {a.name: a.description for a in load_config(EXAMPLE / "model.yaml").adapters}
    assert described["klatt"] and load_manifest(example_dist / "model")["adapters"]["klatt"]["description"] == \
        described["klatt"]
    assert "tunes the model to one kind of voice" in page.inner_text("#lora-about")
    page.select_option("#lora", "klatt")
    wait_for(page, "() => window.webbuild.lora === 'klatt' || window.webbuild.error", 60)
    assert page.inner_text("#lora-about") == described["klatt"]
    page.select_option("#lora", "")
    wait_for(page, "() => window.webbuild.lora === null", 60)
    assert "tunes the model to one kind of voice" in page.inner_text("#lora-about")


def test_sample_buttons_say_their_words_and_the_clip_plays(page, example_dist):
    samples = json.loads((example_dist / SAMPLES_FILE).read_text())["samples"]
    for s in samples:
        assert page.inner_text(f"#{s['id']}").split("\n") == [s["label"], f"“{s['text']}”"]
    assert page.is_hidden("#clip")
    page.click("#sample-1")
    wait_for(page, DONE, 120)
    assert page.evaluate("() => window.webbuild.error") is None
    src = page.get_attribute("#clip", "src")
    assert src.startswith("blob:") and src == page.evaluate("() => window.webbuild.clip") and page.is_visible("#clip")
    assert clip_bytes(page) == (example_dist / samples[1]["src"]).read_bytes()
    # the element can play it: its duration is the clip's
    page.evaluate("() => new Promise((ok) => { const a = document.getElementById('clip'); "
                  "a.readyState >= 1 ? ok() : a.addEventListener('loadedmetadata', ok); })")
    pcm = read_wav(example_dist / samples[1]["src"])
    assert abs(page.evaluate("() => document.getElementById('clip').duration") - len(pcm) / 16000) < 0.01


def test_copy_puts_the_transcript_on_the_clipboard(page):
    page.click("#sample-0")
    wait_for(page, DONE, 120)
    text = page.evaluate("() => window.webbuild.text")
    assert text.strip() and page.is_enabled("#copy")
    page.click("#copy")
    assert page.evaluate("() => navigator.clipboard.readText()") == text


def test_drop_a_file_on_the_page(page, example_dist):
    wav = (example_dist / "samples").glob("*.wav")
    path = sorted(wav)[2]
    before = page.evaluate("() => window.webbuild.clip")  # the drop shows its clip and starts in one task
    page.evaluate("""(b64) => {
        const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
        const data = new DataTransfer();
        data.items.add(new File([bytes], 'dropped.wav', { type: 'audio/wav' }));
        const zone = document.getElementById('drop');
        zone.dispatchEvent(new DragEvent('dragover', { dataTransfer: data, bubbles: true, cancelable: true }));
        zone.dispatchEvent(new DragEvent('drop', { dataTransfer: data, bubbles: true, cancelable: true }));
    }""", base64.b64encode(path.read_bytes()).decode())
    # the dropped clip's transcription, done (on wasm it can start and end between two polls of 'transcribing')
    wait_for(page, f"() => window.webbuild.clip !== {json.dumps(before)} && ({DONE.removeprefix('() => ')})", 120)
    state = page.evaluate("() => window.webbuild")
    assert state["error"] is None and abs(state["metrics"]["audio_ms"] - len(read_wav(path)) / 16) < 1
    assert page.inner_text("#clip-name") == "“dropped.wav”:"
    assert clip_bytes(page) == path.read_bytes()


@pytest.fixture(scope="module")
def two_sentences(example_dist, tmp_path_factory) -> Path:
    """Two sample clips with a second of quiet between: two chunks (the example ends a chunk at every pause)."""
    clips = [read_wav(p) for p in sorted((example_dist / "samples").glob("*.wav"))[:2]]
    path = tmp_path_factory.mktemp("page") / "two.wav"
    write_wav(path, np.concatenate([clips[0], np.zeros(16000, np.float32), clips[1]]))
    return path


def stamp(samples: int, sep: str) -> str:
    ms = round(samples / 16)
    return f"{ms // 3600000:02d}:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d}{sep}{ms % 1000:03d}"


def test_transcript_downloads_as_text_and_subtitles(page, example_dist, two_sentences):
    page.set_input_files("#file", str(two_sentences))
    wait_for(page, DONE, 180)
    state = page.evaluate("() => window.webbuild")
    reference = load_transcriber(example_dist)
    cuts = reference.chunk_ranges(read_wav(two_sentences))  # the chunk policy's, folded onto speech
    assert len(cuts) == 2 and state["chunks"] == [list(c) for c in cuts], (state["chunks"], cuts)
    texts = [reference.text(d.tokens) for d in reference.decode_file(two_sentences)]
    assert state["texts"] == texts and all(texts)
    files = {}
    for fmt in ("txt", "srt", "vtt"):
        with page.expect_download() as dl:
            page.click(f"#save-{fmt}")
        assert dl.value.suggested_filename == f"transcript.{fmt}"
        files[fmt] = Path(dl.value.path()).read_text(encoding="utf-8")
    assert files["txt"] == state["text"] + "\n" == " ".join(texts) + "\n"
    assert files["srt"] == "\n".join(f"{i + 1}\n{stamp(a, ',')} --> {stamp(b, ',')}\n{t}\n"
                                     for i, ((a, b), t) in enumerate(zip(cuts, texts)))
    assert files["vtt"] == "WEBVTT\n\nNOTE language: English\n\n" + "\n".join(  # the language: a comment block
        f"{stamp(a, '.')} --> {stamp(b, '.')}\n{t}\n" for (a, b), t in zip(cuts, texts))
    cue = r"\d\d:\d\d:\d\d[,.]\d{3} --> \d\d:\d\d:\d\d[,.]\d{3}"
    assert len(re.findall(cue, files["srt"])) == len(re.findall(cue, files["vtt"])) == 2


def test_retry_after_a_failed_load(browser, server, example_dist):
    """A shard missing (HTTP 404: no use retrying in the loader) fails the load; once it is back, Retry loads
    the model without reloading the page."""
    page = new_page(browser)
    shard = load_manifest(example_dist / "model")["files"][RUNTIME_FILE]["parts"][0]["shard"]  # every load reads it
    failing = {"on": True, "hits": 0}

    def route(r):
        if failing["on"]:
            failing["hits"] += 1
            r.fulfill(status=404, body="gone")
        else:
            r.continue_()

    page.context.route(f"**/model/{shard}", route)
    try:
        open_page(page, server.url)
        state = page.evaluate("() => window.webbuild")
        assert state["status"] == "error" and failing["hits"] >= 1, (state, failing)
        assert page.is_visible("#retry") and page.is_visible("#error")
        failing["on"] = False
        page.evaluate("() => { window.loaded = true; }")  # gone if the page reloads
        page.click("#retry")
        wait_for(page, "() => ['ready', 'error'].includes(window.webbuild.status)", 120)
        state = page.evaluate("() => window.webbuild")
        assert state["status"] == "ready" and page.evaluate("() => window.loaded") is True, state
        assert page.is_hidden("#retry") and page.is_hidden("#error")
        page.click("#sample-0")
        wait_for(page, DONE, 120)
        assert page.evaluate("() => window.webbuild.error") is None
    finally:
        page.context.close()


# ---------------------------------------------------------------- long files and failures (issue 47)

# every text the progress line shows, from the next transcription on
PROGRESS_LOG = """() => { window.progressLog = []; new MutationObserver(() => window.progressLog.push(
    document.getElementById('progress-text').textContent)).observe(document.getElementById('progress-text'),
    { childList: true, characterData: true, subtree: true }); }"""


def joined_samples(example_dist, path: Path, times: int) -> Path:
    """The sample clips `times` over with a second of quiet after each: a chunk per clip (the example ends a chunk
    at every pause)."""
    quiet = np.zeros(16000, np.float32)
    clips = [read_wav(p) for p in sorted((example_dist / "samples").glob("*.wav"))] * times
    write_wav(path, np.concatenate([part for clip in clips for part in (clip, quiet)]))
    return path


def test_a_long_file_shows_its_chunks_and_cancel_keeps_the_text_so_far(page, example_dist, tmp_path):
    """The progress line says which chunk of how many runs; Cancel stops the worker after its current step, the
    transcript so far stays (the chunks done as the reference decodes them) and the status says it was cancelled."""
    long = joined_samples(example_dist, tmp_path / "long.wav", 3)
    reference = load_transcriber(example_dist)
    cuts = reference.chunk_ranges(read_wav(long))
    page.evaluate(PROGRESS_LOG)
    page.set_input_files("#file", str(long))
    wait_for(page, f"() => (window.webbuild.chunk?.index ?? 0) >= 1 || {DONE.removeprefix('() => ')}", 120)
    page.click("#cancel")
    wait_for(page, DONE, 120)
    state = page.evaluate("() => window.webbuild")
    n = len(state["texts"])
    assert state["error"] is None and state["cancelled"] is True and 2 <= n < len(cuts), (n, len(cuts))
    assert state["chunks"] == [list(c) for c in cuts[:n]]
    texts = [reference.text(d.tokens) for d in reference.decode_file(long)]
    assert state["texts"][:-1] == texts[:n - 1]  # the last one may be cut short
    assert state["text"] == " ".join(t for t in state["texts"] if t) and page.inner_text("#transcript").strip()
    status = page.inner_text("#status")
    assert status.startswith("Cancelled after ") and "the transcript so far is kept" in status, status
    log = page.evaluate("() => window.progressLog")
    assert [f"Chunk {i} of {len(cuts)} (from " in " ".join(log) for i in (1, 2)] == [True, True], log
    assert page.is_hidden("#cancel") and page.is_hidden("#progress")


def test_segments_show_their_start_times_and_seek_the_player(page, two_sentences):
    page.set_input_files("#file", str(two_sentences))
    wait_for(page, DONE, 180)
    state = page.evaluate("() => window.webbuild")
    assert state["error"] is None and len(state["chunks"]) == 2
    times = page.eval_on_selector_all("#transcript .segment .time", "ts => ts.map((t) => t.dataset.time)")
    start = state["chunks"][1][0] / 16000
    assert times == ["0:00", f"0:{int(start):02d}"], times
    shown = page.eval_on_selector_all("#transcript .segment .time",
                                      "ts => ts.map((t) => getComputedStyle(t, '::before').content)")
    assert shown == [f'"{t}"' for t in times]
    # the words alone in the text (the times are generated content): a copy of the transcript holds no times
    assert page.inner_text("#transcript").split("\n") == state["texts"]
    page.click("#transcript .segment >> nth=1 >> .time")
    assert abs(page.evaluate("() => document.getElementById('clip').currentTime") - start) < 0.05


def test_a_failed_load_names_the_model_file_and_drops_its_stale_retries(browser, server, example_dist):
    """runtime.json's shard answers 503 every time: the loader retries (the notice says so, naming the model's file),
    then fails; the error names the model's file and its part and says what to do, the shard's name is only in the
    console's detail, and no "trying again" notice stays beside it."""
    page = new_page(browser)
    log = watch(page)
    shard = load_manifest(example_dist / "model")["files"][RUNTIME_FILE]["parts"][0]["shard"]
    page.context.route(f"**/model/{shard}", lambda r: r.fulfill(status=503, body="busy"))
    try:
        open_page(page, server.url)
        state = page.evaluate("() => window.webbuild")
        assert state["status"] == "error", state
        error = page.inner_text("#error")
        assert "the model's runtime.json (part 1 of 1)" in error and "try again" in error, error
        assert "shards/" not in error and "shards/" not in page.inner_text("body")
        assert shard in state["errorDetail"] and any(shard in c for c in log["console"]), log["console"]
        retries = [w for w in state["warnings"] if "trying again" in w]
        assert retries and all("the model's runtime.json (part 1 of 1)" in w for w in retries), state["warnings"]
        assert page.is_hidden("#notice"), page.inner_text("#notice")
    finally:
        page.context.close()


def test_the_live_rows_stay_hidden_until_live_transcription_ran(page):
    assert page.is_visible("#m-rtf")
    for row in ("partial", "final", "words"):
        assert page.is_hidden(f"#m-live-{row}"), row


def test_a_visit_served_from_the_cache_says_so(browser, server):
    """The first visit downloads; the second reads every shard from the browser's cache, and the load metric says
    that, with no download in it."""
    context = browser.new_context()
    hide_webgpu(context)
    try:
        loads = []
        for _ in range(2):
            page = context.new_page()
            open_page(page, server.url)
            wait_for(page, "() => window.webbuild.cached", 60)
            state = page.evaluate("() => window.webbuild")
            assert state["status"] == "ready" and state["kept"] is True, state
            loads.append((state["info"]["load"], page.inner_text("#m-load"), page.inner_text("#m-stored")))
            page.close()
        (first, first_text, stored), (second, second_text, _) = loads
        assert first["network_bytes"] > 0 and first["cache_bytes"] == 0 and "download" in first_text, first_text
        assert stored.startswith("yes")
        assert second["network_bytes"] == 0 and second["cache_bytes"] == first["network_bytes"], second
        assert "from this browser's cache" in second_text and "download" not in second_text, second_text
    finally:
        context.close()


def test_a_file_that_cannot_be_decoded_takes_its_player_away(page, tmp_path):
    bad = tmp_path / "not-audio.mp3"
    bad.write_bytes(b"this is no audio at all " * 100)
    page.set_input_files("#file", str(bad))
    wait_for(page, "() => window.webbuild.error", 60)
    assert "not-audio.mp3" in page.inner_text("#error")
    assert page.is_hidden("#clip-row") and page.evaluate("() => window.webbuild.clip") is None


def png() -> bytes:
    """A valid 4x4 PNG picture."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + b"\x80" * 12 for _ in range(4))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 4, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


TONE = np.sin(np.arange(3200) / 10)[:, None] * 0.3  # 0.2 s at 16 kHz
PCM16 = wav_bytes(np.round(TONE * 32767), 16000, 1, 16)  # 6400 data bytes after a 44-byte header
NAN = TONE.copy()
NAN[100, 0] = np.nan
ALAW = wav_bytes(np.full((800, 1), 0xD5), 8000, 1, 8)
TRUNCATED = ("truncated: the data chunk says 6400 bytes, the file holds {}; "
             "the file was cut short: copy or export it again")
UNDECODABLE = ("this file could not be decoded as audio (Unable to decode audio data); it is damaged or not a sound "
               "file this browser reads: choose a WAV, MP3, FLAC or Ogg file")
# issue 47's bad files on the page: (file name, bytes, what the page must say after the name)
BAD_FILES = {
    "corrupt": ("corrupt.wav", np.random.default_rng(0).bytes(20000), UNDECODABLE),
    "truncated": ("truncated.wav", PCM16[:-1001], TRUNCATED.format(5399)),
    "header-only": ("header-only.wav", PCM16[:44], TRUNCATED.format(0)),
    "png": ("picture.png", png(), UNDECODABLE),
    "4 GHz": ("ghz.wav", wav_bytes(np.round(TONE * 32767), 4_000_000_000, 1, 16),
              "sample rate 4000000000 Hz is outside 1000-384000 Hz"),
    "NaN": ("nan.wav", wav_bytes(NAN, 16000, 3, 32), "sample 100 (0.01 s) is NaN; the file is corrupt"),
    "zero-length file": ("empty.wav", b"", "the file is empty"),
    "zero-length audio": ("no-samples.wav", wav_bytes(TONE[:0], 16000, 1, 16), "the WAV file holds no samples"),
    "A-law": ("alaw.wav", ALAW[:20] + struct.pack("<H", 6) + ALAW[22:],
              "unsupported WAV encoding (format 6, 8-bit); supported: PCM 8/16/24/32-bit and float 32/64-bit"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_bad_file_is_one_message_and_the_page_goes_on(page, tmp_path, case):
    """Each bad file after a sample's transcription: one line naming the file in #error, the sample's player taken
    away, nothing transcribed, no console error; then a sample transcribes again."""
    name, data, words = BAD_FILES[case]
    (tmp_path / name).write_bytes(data)
    page.click("#sample-0")
    wait_for(page, DONE, 120)
    assert page.is_visible("#clip-row")  # the sample's player, which the bad file must take away
    console: list[str] = []

    def log(m):
        console.append(f"{m.type}: {m.text}")
    page.on("console", log)
    try:
        page.set_input_files("#file", str(tmp_path / name))
        wait_for(page, "() => window.webbuild.error || window.webbuild.status === 'done'", 60)
        page.wait_for_timeout(200)  # a late console error (the player's load) is caught
    finally:
        page.remove_listener("console", log)
    state = page.evaluate("() => window.webbuild")
    assert page.inner_text("#error") == f"Error: {name}: {words}"
    assert state["status"] == "ready" and not state["text"] and page.inner_text("#status") == "Ready."
    assert page.is_hidden("#clip-row") and state["clip"] is None
    assert not [c for c in console if c.startswith("error")], console
    page.click("#sample-1")
    wait_for(page, DONE, 120)
    state = page.evaluate("() => window.webbuild")
    assert state["error"] is None and state["text"] and page.is_hidden("#error")


def test_a_full_storage_still_loads_the_model_and_says_it_is_not_kept(browser, server):
    """A quota of 1000 bytes for the site (DevTools Storage.overrideQuotaForOrigin): every cache write fails; the
    model loads from the network and transcribes, and the page says it could not be kept for the next visit."""
    page = new_page(browser)
    cdp = page.context.new_cdp_session(page)
    origin = server.url.split("/", 3)
    cdp.send("Storage.overrideQuotaForOrigin", {"origin": f"{origin[0]}//{origin[2]}", "quotaSize": 1000})
    try:
        open_page(page, server.url)
        wait_for(page, "() => window.webbuild.cached", 60)
        state = page.evaluate("() => window.webbuild")
        assert state["status"] == "ready" and state["kept"] is False, state
        full = [w for w in state["warnings"] if "could not be kept" in w]
        assert len(full) == 1 and "storage for the site is full" in full[0], state["warnings"]
        assert page.inner_text("#m-stored").startswith("no: the next visit downloads it again")
        page.click("#sample-0")
        wait_for(page, DONE, 120)
        assert page.evaluate("() => window.webbuild.error") is None
    finally:
        page.context.close()

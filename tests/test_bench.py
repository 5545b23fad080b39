"""`webbuild bench` on the embedded example built as is: the Node harness runs the built site's own
runtime modules on the wasm EP and reports sane fields (no timing asserts beyond > 0); --runtime browser
transcribes the site's samples on its own page."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.command import webbuild
from webbuild.site.contract import SAMPLES_FILE

pytestmark = [
    pytest.mark.skipif(not shutil.which("node"), reason="no node"),
]


@pytest.fixture(scope="module")
def site(example_dist):
    return example_dist


def test_bench_wasm_reports_the_metrics(site, tmp_path):
    out = tmp_path / "bench.json"
    run = webbuild("bench", str(site), "--ep", "wasm", "--decode-tokens", "8", "--max-clips", "2", "--json", str(out))
    assert run.returncode == 0, run.stderr
    assert "ms/token" in run.stdout and "TTFT" in run.stdout
    r = json.loads(out.read_text())
    assert (r["ep"], r["variant"], r["kv_cache"]) == ("wasm", "fp32", "cpu")
    assert r["gpu"].startswith("none")
    assert r["load"]["total_ms"] >= r["load"]["session_ms"] > 0
    # the load's parts, printed too: hashing and sessions overlap the download, so they are milestones and times
    load = r["load"]
    assert set(load) == {"download_ms", "hash_ms", "verified_ms", "session_ms", "warmup_ms", "total_ms",
                         "encoder_warmup_ms", "int8_ms", "runs_check_ms", "decode_form_ms", "cache_ms", "cache_bytes",
                         "network_bytes"}
    assert 0 < load["download_ms"] <= load["verified_ms"] <= load["total_ms"] and load["hash_ms"] > 0
    assert load["encoder_warmup_ms"] == 0  # wasm warms no shape classes, so nothing runs between the sessions
    assert load["int8_ms"] == 0  # the example's twins are float: no int8 weights to derive
    assert load["runs_check_ms"] == 0 and load["decode_form_ms"] < load["warmup_ms"]  # wasm: neither runs
    assert next(line for line in run.stdout.splitlines() if line.startswith("load")).count(" hash ") == 1
    s = r["summary"]
    assert s["clips"] == 2 and s["clips_matching"] == 2  # the example transcribes its samples exactly
    assert s["encoder_ms"] > 0 and s["ttft_ms"] > s["encoder_ms"] and s["prefill_tokens_per_s"] > 0
    d = r["synthetic_decode"]["ms_per_token"]
    assert d["n"] == 8 and 0 < d["p10"] <= d["median"] <= d["p90"]
    # progress as it goes: the stage, and each clip as n of N
    progress = _progress(run.stderr)
    assert progress[0].startswith("loading the model") and progress[1].startswith("loaded: wasm fp32")
    assert [line.split(":")[0] for line in progress if line.startswith("clip ")] == ["clip 1 of 2", "clip 2 of 2"]
    assert progress[-2:][0].startswith("synthetic decode: 8 tokens")


@pytest.mark.browser
def test_bench_in_the_browser_clicks_the_samples_of_samples_json(site, tmp_path):
    out = tmp_path / "bench.json"
    worker = (site / "worker.js").read_bytes()
    run = webbuild("bench", str(site), "--runtime", "browser", "--ep", "wasm", "--max-clips", "1",
                   "--decode-tokens", "3", "--json", str(out))
    assert run.returncode == 0, run.stderr
    r = json.loads(out.read_text())
    expected = json.loads((site / SAMPLES_FILE).read_text())["samples"][0]["text"]
    assert (r["ep"], r["variant"]) == ("wasm", "fp32")
    assert [(c["expected"], c["match"]) for c in r["clips"]] == [(expected, True)]
    # the synthetic decode ran in the site's worker (of a bench-only copy: the site's worker.js is untouched)
    d = r["synthetic_decode"]["ms_per_token"]
    assert d["n"] == 3 and 0 < d["p10"] <= d["median"] <= d["p90"]
    assert r["counters_per_token"] is None  # the wasm EP makes no WebGPU calls
    assert "wasm EP makes no WebGPU calls" in run.stdout
    assert (site / "worker.js").read_bytes() == worker and "__wbSynth" not in worker.decode()
    progress = _progress(run.stderr)
    assert progress[0].startswith("loading the page in ")
    assert [line.split(":")[0] for line in progress[1:]] == ["clip 1 of 1", "synthetic decode"]


@pytest.mark.browser
def test_bench_in_the_browser_with_an_adapter_picks_it_in_the_page(site, tmp_path):
    """--adapter with --runtime browser: the page's picker switches it on before the clips, which then give the
    Python reference's transcript with that adapter; an adapter the site lacks is a clear error."""
    from webbuild.reference.audio import read_wav
    from webbuild.reference.transcribe import load_transcriber

    out = tmp_path / "bench.json"
    run = webbuild("bench", str(site), "--runtime", "browser", "--ep", "wasm", "--max-clips", "1",
                   "--decode-tokens", "2", "--adapter", "klatt", "--json", str(out))
    assert run.returncode == 0, run.stderr
    r = json.loads(out.read_text())
    sample = json.loads((site / SAMPLES_FILE).read_text())["samples"][0]
    wav = site / sample["src"]  # the clip the page's first sample button plays
    assert r["lora"] == "klatt" and "lora        klatt (picked in the page)" in run.stdout
    assert r["clips"][0]["lora"] == "klatt"  # the page's own word: the transcription ran with it
    assert r["clips"][0]["text"] == load_transcriber(site, adapter="klatt").transcribe(read_wav(wav))
    nope = webbuild("bench", str(site), "--runtime", "browser", "--ep", "wasm", "--max-clips", "0",
                    "--decode-tokens", "2", "--adapter", "nope")
    assert nope.returncode != 0 and "no adapter 'nope'; the site has klatt" in nope.stderr


def _progress(stderr: str) -> list[str]:
    """The `[  12.3s] message` lines' messages."""
    return [line.split("] ", 1)[1] for line in stderr.splitlines() if line.startswith("[") and "] " in line]


def test_bench_rejects_a_folder_that_is_not_a_site(tmp_path):
    run = webbuild("bench", str(tmp_path))
    assert run.returncode == 2
    assert "not a built site" in run.stderr


def test_bench_refuses_both_decode_forms_where_one_form_runs(tmp_path):
    """--decode-forms both (tests/test_bench_counters.py reads a run of it) needs the captured form and Node: with
    --no-graph-capture or in the browser it is refused before anything runs, not answered with one form."""
    for options in (["--no-graph-capture"], ["--runtime", "browser"]):
        why = " ".join(options)
        run = webbuild("bench", str(tmp_path), "--decode-forms", "both", *options)
        assert run.returncode == 2 and f"does not go with {why}" in run.stderr, run.stderr


def test_counted_site_is_a_hard_linked_copy_with_an_instrumented_worker(site, tmp_path):
    from webbuild.tools.bench.instrument import counted_site

    worker = (site / "worker.js").read_text()
    copy = counted_site(site, tmp_path / "copy")
    text = (copy / "worker.js").read_text()
    # counters in front (installed before onnxruntime-web makes its device), the site's worker, the hook
    assert text.index("installGpuCounters(self);") < text.index(worker) < text.index("self.__wbCountedSynth")
    assert "\nexport " not in text.split(worker)[0]  # counters.mjs's exports dropped: one module, no exports
    assert (site / "worker.js").read_text() == worker  # the built site is untouched
    for rel in ("index.html", "model/manifest.json"):
        assert (copy / rel).stat().st_ino == (site / rel).stat().st_ino  # hard links, same file system
    (tmp_path / "worker.mjs").write_text(text)
    check = subprocess.run(["node", "--check", str(tmp_path / "worker.mjs")], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr  # parses as the module worker it is

"""`webbuild verify` on the embedded example (examples/tiny-asr) built into a temporary folder:
green on the built folder (samples, with its LoRA adapter klatt picked and with none again, + held-out clips
on wasm and one on WebGPU, every check, the tokens equal to the Python reference's), red on a wrong
transcript (through the deployed-URL path), and input errors with exit code 2. The token comparison on
crafted lists: test_verify_tokens.py."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from tests.command import webbuild
from tests.example_config import EXAMPLE, example_config, sample_text
from webbuild.tools.serve import start
from webbuild.tools.verify.tokens import MAX_TIE_MARGIN
from webbuild.tools.verify.visits import corrupt_warning

CHECKS = {"first visit: model loads", "corrupted shard detected and recovered", "second visit: model loads",
          "second visit loads the model from the cache", "WebGPU off: model loads",
          "wasm fallback when WebGPU is off", "wasm fallback transcribes", "no request leaves the origin",
          "console has no errors", "every transcript within the WER bound (and equal to the Python reference)",
          "decode speed on wasm at or above the floor"}  # the example's model.yaml sets one; verify runs on wasm
WEBGPU_CLIP = {"clips on webgpu: model loads", "decode speed on webgpu at or above the floor"}  # --clips-ep webgpu:1
CORPUS = {"--clips corpus WER on wasm within the bound", "--clips corpus WER on webgpu within the bound"}
LORA = {"adapter klatt: the picker switches it on", "adapter none: the picker switches back",
        "adapter none again: the first tokens exactly"}  # the example ships one adapter
# each sample forced to its own language (model.yaml site.samples[].language), in the order they first appear
SAMPLE_LANGUAGES = [sample["language"] for sample in example_config()["site"]["samples"]]
LANGUAGES = list(dict.fromkeys(SAMPLE_LANGUAGES))
LANGUAGE = {f"language {language} forced: the page names it" for language in LANGUAGES}
# verify's live check, on by default
LIVE = {"live: the page transcribes from the microphone", "live: partial text shown before each clip ends",
        "live: final texts never change", "live: delays measured",
        "live: final texts equal the Python reference's (transcribe --live on the page's capture)"}
ADAPTED = "samples, adapter klatt"
SAMPLE_RUNS = ["samples", ADAPTED, "samples, adapter none again", "samples, context"]  # 4 each
# the language runs: each language's samples
LANGUAGE_RUNS = [(f"samples, language {language}", "wasm") for language in LANGUAGES
                 for _ in range(SAMPLE_LANGUAGES.count(language))]
FLOOR = "decode speed on wasm at or above the floor"
pytestmark = [pytest.mark.browser]


def junit_failures(path: Path, report: dict) -> dict[str, str]:
    """The JUnit file parsed back: its counts agree with the JSON report's clips and checks, per suite and in
    all; returns {case name: failure message} of the failed cases."""
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert set(suites) == {"clips", "checks"}
    failed = {}
    for name, entries in (("clips", report["clips"]), ("checks", report["checks"])):
        cases = suites[name].findall("testcase")
        bad = {c.get("name"): c.find("failure").get("message") for c in cases if c.find("failure") is not None}
        assert int(suites[name].get("tests")) == len(cases) == len(entries)
        assert int(suites[name].get("failures")) == len(bad) == sum(not e["ok"] for e in entries)
        failed |= bad
    assert int(root.get("tests")) == len(report["clips"]) + len(report["checks"])
    assert int(root.get("failures")) == len(failed)
    assert all(m and "\n" not in m for m in failed.values())  # a one-line message, as CI views show it
    return failed


@pytest.fixture(scope="module")
def dist(example_dist):
    return example_dist


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    from webbuild.train.clips import write_heldout_clips

    folder = tmp_path_factory.mktemp("clips")
    write_heldout_clips(folder, 3)
    return folder


@pytest.mark.slow
def test_verify_green_on_the_example(dist, clips, tmp_path):
    report_path = tmp_path / "report.json"
    # --clips-max-wer 1: the held-out clips' WER is the model's (BENCHMARKS.md); here their tokens are the question
    run = webbuild("verify", dist, "--ep", "wasm", "--clips", clips, "--clips-ep", "auto", "--clips-ep", "webgpu:1",
                   "--clips-max-wer", "1", "--json", report_path, "--junit", tmp_path / "junit.xml")
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(report_path.read_text())
    checks = CHECKS | WEBGPU_CLIP | LORA | LANGUAGE | CORPUS | LIVE
    assert report["ok"] and {c["name"] for c in report["checks"]} == checks
    assert junit_failures(tmp_path / "junit.xml", report) == {}
    samples = [(run, "wasm") for run in SAMPLE_RUNS[:3] for _ in range(4)] + LANGUAGE_RUNS + [
        (SAMPLE_RUNS[3], "wasm")] * 4
    assert [(r["run"], r["ep"]) for r in report["clips"]] == (
        samples + [("clips", "wasm")] * 3 + [("clips", "webgpu"), ("wasm fallback", "wasm")])
    assert [r["clip"] for r in report["clips"] if r["run"] == "clips"] == [
        "heldout-000.wav", "heldout-001.wav", "heldout-002.wav", "heldout-000.wav"]  # webgpu:1: the first only
    # every transcript equals the Python reference on the build's own graphs (with the adapter on where it is
    # picked), and the true text
    assert report["reference"] and report["reference_equal"] == 25
    assert all(r["got"] == r["reference"] for r in report["clips"])
    # (the klatt adapter, trained beside general clips in the base's six languages, keeps every sample's text)
    assert all(r["wer"] == 0 for r in report["clips"] if r["run"] not in ("samples, context", "clips"))
    assert all(r["max_wer"] is None for r in report["clips"] if r["run"] in ("samples, adapter klatt",
                                                                                  "samples, context"))
    # a context given, the page tokenises it as the reference does: the same prompt, token for token, and the
    # model reads it (its margins move)
    given = [r for r in report["clips"] if r["run"] == "samples, context"]
    plain = {r["clip"]: r for r in report["clips"] if r["run"] == "samples"}
    assert all(r["tokens"] == r["reference_tokens"] for r in given)
    assert [r["margins"] for r in given] != [plain[r["clip"]]["margins"] for r in given]
    # each sample forced to its own language: the tokens after `language NAME<asr_text>` that the model said itself
    # (it named every sample's language right), the same text, judged
    forced = [r for r in report["clips"] if r["run"].startswith("samples, language ")]
    assert [r["got"] for r in forced] == [plain[r["clip"]]["got"] for r in forced]
    assert all(r["tokens"] == r["reference_tokens"] and r["max_wer"] is not None for r in forced)
    # none again: the first tokens; the adapter (fitted to the Klatt voice) keeps the samples' tokens, but it is on:
    # their margins move, as the reference's with it on do
    runs = {run: [(r["tokens"], r["margins"]) for r in report["clips"] if r["run"] == run] for run in SAMPLE_RUNS}
    assert [t for t, _ in runs["samples, adapter none again"]] == [t for t, _ in runs["samples"]]
    for (tokens, margins), (on_tokens, on_margins) in zip(runs["samples"], runs[ADAPTED], strict=True):
        assert on_tokens == tokens and max(abs(a - b) for a, b in zip(margins, on_margins)) > 0.3
    # ... token for token, each token with the margin the reference gives it, to float32 noise on both EPs
    assert (report["tokens_compared"], report["reference_tokens_equal"], report["passed_under_margin"]) == (25, 25, 0)
    for r in report["clips"]:
        assert r["tokens"] == r["reference_tokens"] and r["difference"] is None and len(r["tokens"]) > 3
        assert len(r["margins"]) == len(r["tokens"]) and min(r["reference_margins"]) > MAX_TIE_MARGIN
        assert r["margin_drift"] == max(abs(a - b) for a, b in zip(r["margins"], r["reference_margins"]))
    assert set(report["margin_drift"]) == {"wasm", "webgpu"}
    assert all(d < MAX_TIE_MARGIN / 4 for d in report["margin_drift"].values())
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite[@name='clips']")
    assert {p.get("name"): p.get("value") for p in suite.find("properties")}["passed_under_margin"] == "0"
    for r in report["clips"]:
        assert r["ttft_ms"] > 0 and r["decode_tokens_per_s"] > 0 and r["prefill_tokens_per_s"] > 0 and r["rtf"] > 0
    assert report["load_ms"]["cold"] > 0 and report["load_ms"]["warm"] > 0
    assert sample_text(0) in run.stdout
    assert run.stdout.rstrip().splitlines()[-2:] == [  # a line per source rate of the clips (all 16 kHz), the verdict
        "RATE 16000 Hz: wasm 24/24 tokens equal, margin drift "
        f"{max(r['margin_drift'] for r in report['clips'] if r['ep'] == 'wasm'):.4f}; webgpu 1/1 tokens equal, "
        f"margin drift {report['margin_drift']['webgpu']:.4f}",
        f"PASS: 25/25 clips (0 passed under the margin), {len(checks)}/{len(checks)} checks"]
    assert all(r["max_wer"] is None for r in report["clips"] if r["run"] == "clips")  # judged as a corpus
    # the floors of the example's model.yaml reached the site (samples.json) and were checked on every clip
    floors = yaml.safe_load((EXAMPLE / "model.yaml").read_text())["verify"]["min_decode_tokens_per_s"]
    for ep, count in (("wasm", 24), ("webgpu", 1)):
        speed = report["decode_speed"][ep]
        assert speed["clips"] == count and speed["floor"] == floors[ep] and speed["floor_from"].startswith("model.yaml")
        assert speed["decode_tokens_per_s"] >= floors[ep]


def test_verify_fails_below_the_decode_speed_floor(example_dist_without_adapters, tmp_path):
    # the build without the adapter: its 4 samples, then again with a language forced and with a context given (the
    # adapter's runs are the green test's)
    # --live off: the live check's own figures are test_live's and the green test's
    run = webbuild("verify", example_dist_without_adapters, "--ep", "wasm", "--min-decode-tokens-per-s", "1e9",
                   "--live", "off", "--json", tmp_path / "r.json", "--junit", tmp_path / "junit.xml")
    assert run.returncode == 1, run.stdout + run.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert all(r["ok"] for r in report["clips"])  # only the speed fails
    [check] = [c for c in report["checks"] if not c["ok"]]
    rate = report["decode_speed"]["wasm"]["decode_tokens_per_s"]
    assert check["name"] == FLOOR and check["detail"] == (
        f"measured {rate:.1f} tokens/s on wasm over 13 clips, below the floor of 1e+09 (--min-decode-tokens-per-s)")
    checks = len(CHECKS | LANGUAGE)  # no adapter, clips or live: the samples' checks and the language ones
    assert run.stdout.rstrip().splitlines()[-2:] == [
        f"FAIL: 13/13 clips (0 passed under the margin), {checks - 1}/{checks} checks",
        f"FAIL check {FLOOR}: {check['detail']}"]
    assert junit_failures(tmp_path / "junit.xml", report) == {FLOOR: check["detail"]}


def test_verify_fails_on_a_wrong_transcript_of_a_deployed_site(example_dist_without_adapters, clips, tmp_path):
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    shutil.copy(clips / "heldout-001.wav", wrong / "clip.wav")
    (wrong / "clip.txt").write_text("this is not what the clip says\n")
    # a "deployed" site, built without the adapter (its 4 samples, three times: the second with a language forced,
    # the third with a context given): verify gets only its URL
    srv = start(example_dist_without_adapters, quiet=True, base_path="/")
    try:
        run = webbuild("verify", srv.url, "--ep", "wasm", "--live", "off", "--clips", wrong,
                       "--clips-max-clip-wer", "0.5", "--json", tmp_path / "r.json", "--junit", tmp_path / "junit.xml")
    finally:
        srv.shutdown()
    assert run.returncode == 1, run.stdout + run.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert not report["ok"] and not report["reference"]  # no local build: no Python reference
    bad = [r for r in report["clips"] if not r["ok"]]
    assert [r["clip"] for r in bad] == ["clip.wav"] and bad[0]["wer"] > 0.5
    assert bad[0]["got"] == "ghost repeat station"
    failed = [c["name"] for c in report["checks"] if not c["ok"]]
    # the set's corpus WER (the site's bound, 0) and the clip's own (--clips-max-clip-wer 0.5)
    assert failed == ["--clips corpus WER on wasm within the bound",
                      "every transcript within the WER bound (and equal to the Python reference)"]
    # the verdict, then one line per failure with its reason, end the output
    reason = "WER 1.00 > 0.50: expected 'this is not what the clip says', got 'ghost repeat station'"
    assert bad[0]["reason"] == reason
    corpus = "100.00% over 1 clip, bound 0.00%"
    assert run.stdout.rstrip().splitlines()[-4:] == [
        f"FAIL: 13/14 clips, {len(CHECKS | LANGUAGE) - 1}/{len(CHECKS | LANGUAGE) + 1} checks",  # no reference
        f"FAIL clip clip.wav (clips, wasm): {reason}",
        f"FAIL check {failed[0]}: {corpus}",
        f"FAIL check {failed[1]}: 13/14 clips; first failure clip.wav (clips): {reason}"]
    details = [c["detail"] for c in report["checks"] if not c["ok"]]
    assert junit_failures(tmp_path / "junit.xml", report) == {
        "clip.wav [wasm]": reason, failed[0]: details[0], failed[1]: details[1]}


def test_corrupt_warning_read_by_code_and_shard():
    """The corrupted-shard check reads the warning's code and shard (window.webbuild.warningCodes), not its words;
    words that name the internal shard, a second corrupt warning, or another shard's fail it."""
    shard = "runtime.json.00000.8357778dc843b62c.bin"
    said = "The model's runtime.json (part 1 of 1) arrived damaged; downloading it again."
    ok = {"warnings": ["no cache", said], "warningCodes": [{"code": "cache-unavailable", "shard": None},
                                                           {"code": "corrupt", "shard": f"shards/{shard}"}]}
    assert corrupt_warning(ok, shard) == (True, ["cache-unavailable:None", f"corrupt:shards/{shard}"])
    assert not corrupt_warning({**ok, "warnings": ["no cache", f"shards/{shard} failed sha256"]}, shard)[0]
    assert not corrupt_warning({**ok, "warnings": [said, said], "warningCodes": ok["warningCodes"][1:] * 2}, shard)[0]
    assert not corrupt_warning(ok, "decoder.onnx.00000.0123456789abcdef.bin")[0]
    assert not corrupt_warning({"warnings": [said]}, shard)[0]  # a page without the codes


def test_verify_input_errors(dist, tmp_path):
    (tmp_path / "a.wav").write_bytes(b"")
    run = webbuild("verify", dist, "--clips", tmp_path)
    assert run.returncode == 2 and "no transcript (.txt) for a.wav" in run.stderr
    run = webbuild("verify", tmp_path / "missing")
    assert run.returncode == 2 and "no such folder" in run.stderr
    run = webbuild("verify", dist, "--clips-ep", "webgpu:0")
    assert run.returncode == 2 and "expected EP or EP:N" in run.stderr and "'webgpu:0'" in run.stderr

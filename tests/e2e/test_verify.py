"""`webbuild verify` on the embedded example (examples/tiny-asr) built into a temporary folder:
green on the built folder (samples + held-out clips, every check), red on a wrong transcript
(through the deployed-URL path), and input errors with exit code 2."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from webbuild.tools.browser import choose
from webbuild.tools.serve import start

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tiny-asr"
CHECKS = {"first visit: model loads", "corrupted shard detected and recovered", "second visit: model loads",
          "second visit loads the model from the cache", "WebGPU off: model loads",
          "wasm fallback when WebGPU is off", "wasm fallback transcribes", "no request leaves the origin",
          "console has no errors", "every transcript within the WER bound (and equal to the Python reference)"}
pytestmark = [
    pytest.mark.skipif(choose().source == "playwright", reason="no system Chrome/Chromium"),
]


def webbuild(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "webbuild.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=1800)


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("verify") / "dist"
    run = webbuild(EXAMPLE / "model.yaml", "-o", out)
    assert run.returncode == 0, run.stderr
    return out


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    from webbuild.train.clips import write_heldout_clips

    folder = tmp_path_factory.mktemp("clips")
    write_heldout_clips(folder, 3)
    return folder


def test_verify_green_on_the_example(dist, clips, tmp_path):
    report_path = tmp_path / "report.json"
    run = webbuild("verify", dist, "--ep", "wasm", "--clips", clips, "--json", report_path)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(report_path.read_text())
    assert report["ok"] and {c["name"] for c in report["checks"]} == CHECKS
    assert [r["run"] for r in report["clips"]] == ["samples"] * 4 + ["clips"] * 3 + ["wasm fallback"]
    # every transcript equals the Python reference on the build's own graphs, and the true text
    assert report["reference"] and report["reference_equal"] == 8
    assert all(r["got"] == r["reference"] and r["wer"] == 0 for r in report["clips"])
    for r in report["clips"]:
        assert r["ttft_ms"] > 0 and r["decode_tokens_per_s"] > 0 and r["prefill_tokens_per_s"] > 0 and r["rtf"] > 0
    assert report["load_ms"]["cold"] > 0 and report["load_ms"]["warm"] > 0
    assert "harmony emerge surprise" in run.stdout and "PASS: 8/8 clips, 10/10 checks" in run.stdout


def test_verify_fails_on_a_wrong_transcript_of_a_deployed_site(dist, clips, tmp_path):
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    shutil.copy(clips / "heldout-001.wav", wrong / "clip.wav")
    (wrong / "clip.txt").write_text("this is not what the clip says\n")
    srv = start(dist, quiet=True, base_path="/")  # a "deployed" site: verify gets only its URL
    try:
        run = webbuild("verify", srv.url, "--ep", "wasm", "--clips", wrong, "--json", tmp_path / "r.json")
    finally:
        srv.shutdown()
    assert run.returncode == 1, run.stdout + run.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert not report["ok"] and not report["reference"]  # no local build: no Python reference
    bad = [r for r in report["clips"] if not r["ok"]]
    assert [r["clip"] for r in bad] == ["clip.wav"] and bad[0]["wer"] > 0.5
    assert bad[0]["got"] == "ghost repeat station"
    failed = [c["name"] for c in report["checks"] if not c["ok"]]
    assert failed == ["every transcript within the WER bound (and equal to the Python reference)"]
    assert "FAIL: 5/6 clips" in run.stdout  # 4 samples, the clip, the wasm fallback


def test_verify_input_errors(dist, tmp_path):
    (tmp_path / "a.wav").write_bytes(b"")
    run = webbuild("verify", dist, "--clips", tmp_path)
    assert run.returncode == 2 and "no transcript (.txt) for a.wav" in run.stderr
    run = webbuild("verify", tmp_path / "missing")
    assert run.returncode == 2 and "no index.html" in run.stderr

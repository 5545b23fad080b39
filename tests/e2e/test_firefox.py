"""A second browser: the embedded example's wasm path in Debian's firefox-esr, driven by puppeteer-core over
WebDriver BiDi (tests/js/firefox-site.mjs). The page loads on wasm, transcribes every sample with the Python
reference's tokens (onnxruntime CPU on the build's graphs that the wasm EP runs; a difference passes only under
verify's tie margin, webbuild/tools/verify/tokens.py), its console, workers' included, shows no error and no
request fails."""

from __future__ import annotations

import json
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest

from tests.conftest import run_wide
from webbuild.site.contract import SAMPLES_FILE
from webbuild.tools.serve import start
from webbuild.tools.verify.visits import Clip, Reference, row

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "js" / "firefox-site.mjs"
PUPPETEER = REPO / "node_modules" / "puppeteer-core"
FIREFOX = shutil.which("firefox-esr")
TIMEOUT_S = 300  # the driver's run takes 14-22 s on the 2-core box; a stalled worker costs the page's 90 s watch more

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(FIREFOX is None, reason="needs firefox-esr (make system-deps)"),
    pytest.mark.skipif(not PUPPETEER.is_dir() or not shutil.which("node"),
                       reason="needs node and puppeteer-core (npm ci: make setup-check)"),
]


@pytest.fixture(scope="module")
def firefox_run(example_dist, tmp_path_factory) -> dict:
    """What the driver saw of the example on ?ep=wasm: the page's state after the load and after each sample,
    its console messages, uncaught errors and failed requests; one Firefox run a test run, whichever test
    worker asks first (the others read its result)."""
    with run_wide(tmp_path_factory, "firefox") as folder:
        out = folder / "run.json"
        if not out.exists():
            drive(example_dist, out)
        result = json.loads(out.read_text())
    assert result["failure"] is None, result["failure"]
    return result


def drive(dist: Path, out: Path) -> None:
    """The driver on `dist`, served; its result in `out`, or a failure naming its exit code and stderr."""
    srv = start(dist, quiet=True)
    try:
        run = subprocess.run(["node", DRIVER, srv.url + "?ep=wasm", out, FIREFOX, str(TIMEOUT_S)],
                             capture_output=True, text=True, timeout=TIMEOUT_S + 60)
    finally:
        srv.shutdown()
    if run.returncode != 0 and not out.is_file():
        out.write_text(json.dumps({"failure": f"the driver exited {run.returncode}: {run.stderr[-2000:]}"}))


def test_firefox_loads_the_example_on_wasm(firefox_run):
    ready = firefox_run["ready"]
    assert firefox_run["firefox"].startswith("firefox/")
    assert ready["status"] == "ready", ready["error"]
    assert ready["info"]["ep"] == "wasm"
    # a worker the page's watch replaced (app/watched-worker.js): the one warning allowed, said in the run's output
    restarted = [w for w, c in zip(ready["warnings"], ready["warningCodes"]) if c["code"] == "worker-restarted"]
    assert len(ready["warnings"]) == len(restarted) <= 1, ready["warnings"]
    for warning in restarted:
        warnings.warn(f"Firefox: {warning}", stacklevel=1)


def test_firefox_transcribes_every_sample_with_the_reference_tokens(firefox_run, example_dist):
    data = json.loads((example_dist / SAMPLES_FILE).read_text())
    variant = firefox_run["ready"]["info"]["variant"]
    reference = Reference(example_dist)
    assert [s["id"] for s in firefox_run["samples"]] == [s["id"] for s in data["samples"]] != []
    for sample, seen in zip(data["samples"], firefox_run["samples"]):
        clip = Clip(Path(sample["src"]).name, sample["text"], button=sample["id"], local=example_dist / sample["src"])
        expected = reference.transcribe(clip, variant, ep="wasm")  # on the graphs the wasm EP runs, as verify
        assert expected is not None and expected.tokens
        result = row(clip, seen["state"], expected, float(data["max_wer"]), "firefox")
        assert result["ok"], f"{clip.name} in Firefox: {result['reason']}"
        assert result["ep"] == "wasm" and result["tokens"], result


def test_firefox_console_has_no_errors_and_no_request_failed(firefox_run):
    errors = [m for m in firefox_run["console"] if m.startswith("error:")] + firefox_run["errors"]
    assert not errors, errors
    assert firefox_run["failedRequests"] == []  # Chromium logs these as console errors, Firefox does not

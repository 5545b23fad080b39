"""The lanes (tests/conftest.py): `make check` selects every test that needs neither torch nor a browser nor
SwiftShader's WebGPU, the same tests whether or not those packages are installed, and where they are not,
the modules that import them skip with the reason instead of failing collection."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.conftest import FIXTURE_MARKS, LANES, missing
from tests.example_config import REPO
from tests.hidden import run_hidden

# what the test extra adds to the main install (pyproject.toml), all refused in the lean collection
OPTIONAL = ("torch", "transformers", "peft", "playwright", "onnxruntime_genai", "jsonschema")
COLLECT = "import pytest; sys.exit(pytest.main(sys.argv[1:]))"


def check_lane() -> str:
    """The marker expression `make check` runs (the Makefile's LANE)."""
    return re.search(r"^LANE := (.+)$", (REPO / "Makefile").read_text(), re.M)[1]


def collect(folder, *args: str, hidden=()) -> tuple[dict, str]:
    """({test id: {fixtures, markers}} of the tests pytest selects with `args`, its output)."""
    out = folder / f"tests-{len(hidden)}.json"
    run = run_hidden(COLLECT, "--collect-only", "-q", "-rs", "-p", "no:cacheprovider", "-p", "tests.lanes_probe", *args,
                     hidden=hidden or ("",), env={**os.environ, "LANES_PROBE_JSON": str(out)})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(out.read_text()), run.stdout


@pytest.fixture(scope="module")
def everything(tmp_path_factory) -> dict:
    """Every test, collected with all that is installed here."""
    return collect(tmp_path_factory.mktemp("lanes"))[0]


def test_the_check_lane_is_what_needs_neither_torch_nor_a_browser(everything, tmp_path):
    lean, output = collect(tmp_path, "-m", check_lane(), hidden=OPTIONAL)
    # without the optional packages the check lane is the same tests: no test of it imports them
    assert set(lean) == {t for t, info in everything.items() if not set(info["markers"]) & set(LANES)}
    assert len(lean) > 400
    for test in lean:
        assert not set(everything[test]["fixtures"]) & set(FIXTURE_MARKS), test
    # the modules that import torch at their top skip with the reason
    assert "SKIPPED [1] tests/test_zoo.py:" in output and "could not import 'torch'" in output
    assert "error" not in output.lower().split("short test summary info")[-1]


def test_markers_follow_the_fixtures_and_the_imports(everything):
    tests = everything

    def lanes(test: str) -> set[str]:
        return set(tests[test]["markers"]) & set(LANES)

    for test, info in tests.items():
        for fixture, lane in FIXTURE_MARKS.items():
            assert fixture not in info["fixtures"] or lane in info["markers"], (test, fixture)
    zoo = [t for t in tests if t.startswith("tests/test_zoo.py::")]  # imports torch: skipped without it
    assert all(lanes(t) == {"torch"} for t in zoo) and (zoo or missing("torch"))
    assert lanes("tests/test_site.py::test_site_files") == {"torch"}  # a site built from a zoo export
    assert lanes("tests/test_site.py::test_theme_contrast_warnings") == set()
    assert lanes("tests/test_site.py::test_microphone_recording") == {"torch", "browser"}  # the playwright fixture
    assert lanes("tests/test_encoder_webgpu.py::test_fused_encoder_matches_onnxruntime_cpu[wasm]") == {"browser"}
    assert lanes("tests/test_bench_timing.py::test_kernels_are_timed_or_the_report_says_why[plain]") == {"webgpu"}
    assert lanes("tests/e2e/test_verify.py::test_verify_input_errors") == {"browser"}

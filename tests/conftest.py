"""What the tests share: the fixtures more than one test module uses, and the lanes.

Lanes. Every test gets a marker for each thing it needs that a plain install lacks (pyproject.toml
registers them):
- torch: it uses a fixture that exports with torch (FIXTURE_MARKS, also through the fixtures it
  uses), or its module imports torch, transformers or peft, directly or through the webbuild and test
  modules it imports from (module_marks);
- browser: it uses the playwright fixture, or says so itself (Chromium started by a subprocess);
- webgpu: it says so itself (WebGPU on SwiftShader in Node, through Dawn).
`make check` runs the tests with none of them (LANE in the Makefile), `make test` all. Where what a
marker needs is missing, its tests are skipped with the reason (missing()); a module that imports an
optional package at its top does so through pytest.importorskip, so that it skips instead of failing
collection.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import shutil
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from tests.command import webbuild
from tests.example_config import EXAMPLE, write_example_config
from webbuild.tools.bench import NODE_ARGS_ENV
from webbuild.tools.browser import ARGS_ENV

# V8's optimising wasm compiler spends about 50 s of CPU on onnxruntime-web's 25 MB module in every Node run
# and Chromium page on a 2-core machine, for code the tests' tiny models hardly run: its baseline compiler
# only, for every Node the bench starts and every Chromium the tests launch (subprocesses inherit it)
os.environ.setdefault(NODE_ARGS_ENV, "--liftoff-only")
os.environ.setdefault(ARGS_ENV, "--js-flags=--liftoff-only")

LANES = ("torch", "browser", "webgpu")
FIXTURE_MARKS = {"tiny_model": "torch", "zoo": "torch", "playwright": "browser", "webgpu_bench": "webgpu"}
PACKAGE_MARKS = {"torch": "torch", "transformers": "torch", "peft": "torch", "playwright": "browser"}
SWIFTSHADER_ICD = Path("/usr/lib/chromium/vk_swiftshader_icd.json")  # what the Node bench's Dawn loads


def installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except ImportError:  # a meta-path finder that refuses it (tests/hidden.py)
        return False


@cache
def missing(lane: str) -> str | None:
    """Why the tests of `lane` cannot run here, or None."""
    if lane == "torch":
        absent = [p for p in ("torch", "transformers") if not installed(p)]
        return f"needs {' and '.join(absent)}: pip install -e '.[zoo]' (make setup-test)" if absent else None
    if lane == "browser":
        if not installed("playwright"):
            return "needs playwright: pip install -e '.[verify]' (make setup-test)"
        from webbuild.tools.browser import choose

        return "needs a system Chrome/Chromium (make system-deps)" if choose().source == "playwright" else None
    if not shutil.which("node") or not SWIFTSHADER_ICD.is_file():
        return f"needs node and Chromium's SwiftShader ({SWIFTSHADER_ICD})"
    return None


_module_marks: dict[str, frozenset[str]] = {}


def module_marks(module) -> frozenset[str]:
    """The lanes of the packages `module` imports at its top: the modules, functions and classes its
    namespace holds, followed through the webbuild and test modules they come from."""
    name = module.__name__
    if name not in _module_marks:
        _module_marks[name] = frozenset()  # a cycle adds nothing
        marks = set()
        for value in list(vars(module).values()):
            if inspect.ismodule(value):
                source = value.__name__
            elif inspect.isclass(value) or inspect.isfunction(value):
                source = getattr(value, "__module__", None) or ""
            else:
                continue
            root = source.split(".")[0]
            if root in PACKAGE_MARKS:
                marks.add(PACKAGE_MARKS[root])
            elif root in ("webbuild", "tests") and source != name and source in sys.modules:
                marks |= module_marks(sys.modules[source])
        _module_marks[name] = frozenset(marks)
    return _module_marks[name]


@pytest.hookimpl(tryfirst=True)  # before -m reads the markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        lanes = {FIXTURE_MARKS[f] for f in getattr(item, "fixturenames", ()) if f in FIXTURE_MARKS}
        if getattr(item, "module", None) is not None:
            lanes |= module_marks(item.module)
        for lane in sorted(lanes - {m.name for m in item.iter_markers()}):
            item.add_marker(lane)
        for lane in LANES:
            if item.get_closest_marker(lane) and (reason := missing(lane)):
                item.add_marker(pytest.mark.skip(reason=reason))


# ---------------------------------------------------------------- zoo exports (torch)


@pytest.fixture(scope="session")
def tiny_model():
    from webbuild.zoo.build import random_model

    return random_model("tiny", seed=0)


@pytest.fixture(scope="session")
def zoo_export(tiny_model, tmp_path_factory):
    """zoo_export(layout, exporter) -> folder of that export of the same random tiny model."""
    from webbuild.zoo.export import export_model

    made: dict[tuple[str, str], Path] = {}

    def get(layout: str = "split", exporter: str = "torchscript") -> Path:
        if (layout, exporter) not in made:
            out = tmp_path_factory.mktemp("zoo") / f"{layout}-{exporter}"
            export_model(*tiny_model, out, layout, exporter)
            made[layout, exporter] = out
        return made[layout, exporter]

    return get


# ---------------------------------------------------------------- the embedded example, built once


@dataclass(frozen=True)
class Build:
    dist: Path
    stdout: str
    stderr: str  # the log


@pytest.fixture(scope="session")
def example_build(tmp_path_factory) -> Build:
    """`webbuild examples/tiny-asr/model.yaml -o <dist> -v`, once a session: the example as is (default
    base path, its LoRA adapter, the wasm twins). Tests only read the folder; one that changes a site
    changes a copy."""
    dist = tmp_path_factory.mktemp("example") / "dist"
    run = webbuild(EXAMPLE / "model.yaml", "-o", dist, "-v")
    assert run.returncode == 0, run.stderr
    return Build(dist, run.stdout, run.stderr)


@pytest.fixture(scope="session")
def example_dist(example_build) -> Path:
    return example_build.dist


@pytest.fixture(scope="session")
def example_dist_without_adapters(tmp_path_factory) -> Path:
    """The embedded example built without its LoRA adapter, once a session; read-only."""
    work = tmp_path_factory.mktemp("example-without-adapters")
    run = webbuild(write_example_config(work, adapters=[]), "-o", work / "dist")
    assert run.returncode == 0, run.stderr
    return work / "dist"


# ---------------------------------------------------------------- WebGPU on SwiftShader

BENCH_DECODE = 4  # decode tokens of a SwiftShader bench: slow, so few


@pytest.fixture(scope="session")
def webgpu_bench(tmp_path_factory):
    """webgpu_bench(site, *options, run=0) -> (report, terminal output) of `webbuild bench SITE --ep webgpu
    --swiftshader --decode-tokens 4 OPTIONS`, made once a session per (site, options, run): the counters'
    and the timing's tests read the same runs (`run` asks for another, to compare two)."""
    made: dict[tuple, tuple[dict, str]] = {}

    def get(site: Path, *options: str, run: int = 0) -> tuple[dict, str]:
        key = (site, options, run)
        if key not in made:
            out = tmp_path_factory.mktemp("bench") / "bench.json"
            bench = webbuild("bench", site, "--ep", "webgpu", "--swiftshader", "--decode-tokens", BENCH_DECODE,
                             "--json", out, *options, timeout=900)
            assert bench.returncode == 0, bench.stderr
            report = json.loads(out.read_text())
            assert report["ep"] == "webgpu", report["adapter"]
            assert report["synthetic_decode"]["ms_per_token"]["n"] == BENCH_DECODE
            made[key] = report, bench.stdout
        return made[key]

    return get


# ---------------------------------------------------------------- the browser


@pytest.fixture(scope="module")  # per module: two live sync drivers in one thread refuse to start
def playwright():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p


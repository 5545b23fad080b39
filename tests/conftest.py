"""What the tests share: the fixtures more than one test module uses, and the lanes.

Lanes. Every test gets a marker for each thing it needs that a plain install lacks (pyproject.toml
registers them):
- torch: it uses a fixture that exports with torch (FIXTURE_MARKS, also through the fixtures it
  uses), or its module imports torch, transformers or peft, directly or through the webbuild and test
  modules it imports from (module_marks);
- browser: it uses the playwright fixture, or says so itself (Chromium started by a subprocess);
- webgpu: it says so itself (WebGPU on SwiftShader in Node, through Dawn);
- install: it says so itself (a wheel built and installed into a new venv, the README's commands from a
  fresh clone: minutes, and pip/npm fetch what the machine lacks).
`make check` runs the tests with none of them (LANE in the Makefile), `make test` all. Where what a
marker needs is missing, its tests are skipped with the reason (missing()); a module that imports an
optional package at its top does so through pytest.importorskip, so that it skips instead of failing
collection.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import inspect
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from tests.command import webbuild
from tests.example_config import EXAMPLE, write_example_config
from tests.fusion.exporters import cache_root
from webbuild.site import ort_files
from webbuild.tools.bench import NODE_ARGS_ENV, PLAIN_SECTION
from webbuild.tools.browser import ARGS_ENV

# V8's optimising wasm compiler spends about 50 s of CPU on onnxruntime-web's 25 MB module in every Node run
# and Chromium page on a 2-core machine, for code the tests' tiny models hardly run: its baseline compiler
# only, for every Node the bench starts and every Chromium the tests launch (subprocesses inherit it)
os.environ.setdefault(NODE_ARGS_ENV, "--liftoff-only")
os.environ.setdefault(ARGS_ENV, "--js-flags=--liftoff-only")

# onnxruntime-web's site files, package data that an install puts into webbuild/site/onnxruntime-web/ (setup.py,
# `make ort`): a checkout installed before they were package data gets them here, from its node_modules (each
# file written in one rename, so the xdist workers may both do it)
for _lock, _dest in ort_files.VENDORED:  # and Silero VAD's model, into webbuild/site/silero-vad/
    if ort_files.problems(_dest, _lock):
        ort_files.vendor(Path(__file__).resolve().parents[1] / "node_modules" / ort_files.lock(_lock)["package"],
                         _dest, _lock)

LANES = ("torch", "browser", "webgpu", "install")
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
    if lane == "install":
        return None if shutil.which("node") and shutil.which("npm") else "needs node and npm"
    if not shutil.which("node") or not SWIFTSHADER_ICD.is_file():
        return f"needs node and Chromium's SwiftShader ({SWIFTSHADER_ICD})"
    return None


@cache
def direct_sources(name: str) -> frozenset[str]:
    """The modules module `name`'s namespace holds things from: modules, and functions and classes by the
    module that defines them (what its top-level imports brought in)."""
    found = set()
    for value in list(vars(sys.modules[name]).values()):
        if inspect.ismodule(value):
            found.add(value.__name__)
        elif inspect.isclass(value) or inspect.isfunction(value):
            found.add(getattr(value, "__module__", None) or "")
    return frozenset(found - {name, ""})


def sources(module) -> set[str]:
    """direct_sources(), followed through every webbuild and test module among them."""
    seen, todo = set(), [module.__name__]
    while todo:
        for source in direct_sources(todo.pop()) - seen:
            seen.add(source)
            if source.split(".")[0] in ("webbuild", "tests") and source in sys.modules:
                todo.append(source)
    return seen


def module_marks(module) -> set[str]:
    """The lanes of the packages `module` imports at its top, directly or through webbuild and test modules."""
    return {PACKAGE_MARKS[root] for root in {s.split(".")[0] for s in sources(module)} if root in PACKAGE_MARKS}


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
    # the modules of the slow tests first, each whole (its module fixtures made once): with two workers, a
    # long test started last would leave one worker running it alone at the end
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)


# ---------------------------------------------------------------- zoo exports (torch)
# The tiny preset's exports, cached across sessions and clones (~/.cache/webbuild, or $WEBBUILD_CACHE, as the
# Optimum exports are) under a key of the source of the zoo and of what it imports and of the versions of
# the exporters' packages, so that a change to the exporters rebuilds them instead of testing stale graphs.
# Dynamo exports (~20-40 s each) are only built when a test asks for them.


ZOO_DIR = Path(__file__).resolve().parents[1] / "webbuild" / "zoo"


def zoo_key() -> str:
    """The zoo exports' cache key: the exporters' packages' versions, and the source of the zoo and of the
    webbuild modules it imports."""
    import onnx
    import onnxscript
    import torch
    import transformers

    import webbuild.zoo.build
    import webbuild.zoo.export
    import webbuild.zoo.published_int4

    zoo = [webbuild.zoo.build, webbuild.zoo.export, webbuild.zoo.published_int4]
    used = {name for module in zoo for name in sources(module) if name.startswith("webbuild.")}
    files = sorted({*ZOO_DIR.glob("*.py"), *(Path(sys.modules[name].__file__) for name in used)})
    versions = (torch.__version__, transformers.__version__, onnx.__version__, onnxscript.__version__)
    h = hashlib.sha256(" ".join(versions).encode())
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


class Zoo:
    def __init__(self, root: Path):
        self.root = root
        self._model = None

    def made(self, name: str, make) -> Path:
        """root/name, made by make(folder) into a folder of its own first when missing: another session may
        make the same one at the same time (the cache is shared), and none sees it half written."""
        out = self.root / name
        if out.exists():
            return out
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f".{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another test worker making it: wait for theirs
            if not out.exists():
                with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=self.root) as tmp:
                    make(Path(tmp) / name)
                    with contextlib.suppress(OSError):  # made meanwhile by another session: theirs stays
                        os.rename(Path(tmp) / name, out)
        return out

    def model(self):
        if self._model is None:
            from webbuild.zoo.build import random_model

            self._model = random_model("tiny", seed=0)
        return self._model

    def export(self, layout: str, exporter: str) -> Path:
        """The export folder for (layout, exporter)."""
        from webbuild.zoo.export import export_model

        return self.made(f"{layout}-{exporter}", lambda out: export_model(*self.model(), out, layout, exporter))

    def source(self, layout: str, exporter: str) -> Path:
        """What fuse_decoder takes: the split folder, or the merged .onnx file."""
        out = self.export(layout, exporter)
        return out if layout == "qwen3-asr-split" else out / "decoder_model_merged.onnx"

    def family(self, name: str) -> Path:
        """A merged export of a tiny Llama / Qwen2 / Qwen3 CausalLM (fusion.tests.sources)."""
        from tests.fusion.sources import export_family

        return self.made(f"family-{name}", lambda out: export_family(name, out)) / "decoder_model_merged.onnx"

    def quantized(self, layout: str = "merged") -> Path:
        """A torchscript zoo export with int4 MatMulNBits (block 64) weights, as fuse_decoder takes it."""
        from webbuild.zoo.published_int4 import quantize_export

        source = self.export(layout, "torchscript")
        # float activations: the fused graph's packed MatMulNBits and the source's three
        # would round int8 activations differently at accuracy level 4
        out = self.made(f"{layout}-torchscript-q4", lambda out: quantize_export(source, out, accuracy_level=0))
        return out if layout == "qwen3-asr-split" else out / "decoder_model_merged.onnx"

    def hf(self) -> Path:
        from webbuild.zoo.build import save_text_decoder_hf

        return self.made("hf", lambda out: save_text_decoder_hf(*self.model(), out))


@pytest.fixture(scope="session")
def zoo() -> Zoo:
    return Zoo(cache_root() / "zoo" / zoo_key())


@pytest.fixture(scope="session")
def tiny_model(zoo):
    """(model, tokenizer) of the zoo's tiny preset, random weights (seed 0): what the zoo's exports export."""
    return zoo.model()


@pytest.fixture(scope="session")
def zoo_export(zoo):
    """zoo_export(layout, exporter) -> folder of that export of the tiny model (cached across sessions)."""

    def get(layout: str = "qwen3-asr-split", exporter: str = "torchscript") -> Path:
        return zoo.export(layout, exporter)

    return get


# ---------------------------------------------------------------- the embedded example, built once


@dataclass(frozen=True)
class Build:
    dist: Path
    stdout: str
    stderr: str  # the log


def run_root(tmp_path_factory) -> Path:
    """A folder shared by the whole test run: with pytest-xdist (`make check` and `make test` run two
    workers) each worker has a base temp folder of its own inside it."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def run_wide(tmp_path_factory, name: str) -> Iterator[Path]:
    """The folder run_root/name, held under an exclusive lock: what one test worker makes there the others
    wait for, and none reads it half written."""
    folder = run_root(tmp_path_factory) / name
    folder.mkdir(exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield folder


def built_once(tmp_path_factory, name: str, args) -> Build:
    """`webbuild ARGS(folder) -o folder/dist` once a test run, whichever worker asks first: the build is the
    costliest thing several test modules read."""
    with run_wide(tmp_path_factory, f"shared-{name}") as folder:
        log = folder / "log.json"
        if not log.exists():
            run = webbuild(*args(folder), "-o", folder / "dist")
            assert run.returncode == 0, run.stderr
            log.write_text(json.dumps([run.stdout, run.stderr]))
        stdout, stderr = json.loads(log.read_text())
    return Build(folder / "dist", stdout, stderr)


@pytest.fixture(scope="session")
def example_build(tmp_path_factory) -> Build:
    """`webbuild examples/tiny-asr/model.yaml -o <dist> -v`, once a test run: the example as is (default
    base path, its LoRA adapter, the wasm twins). Tests only read the folder; one that changes a site
    changes a copy."""
    return built_once(tmp_path_factory, "example", lambda _: (EXAMPLE / "model.yaml", "-v"))


@pytest.fixture(scope="session")
def example_dist(example_build) -> Path:
    return example_build.dist


@pytest.fixture(scope="session")
def example_dist_without_adapters(tmp_path_factory) -> Path:
    """The embedded example built without its LoRA adapter, once a test run; read-only."""
    return built_once(tmp_path_factory, "example-without-adapters",
                      lambda folder: (write_example_config(folder, adapters=[]),)).dist


# ---------------------------------------------------------------- WebGPU on SwiftShader

BENCH_DECODE = 4  # decode tokens of a SwiftShader bench: slow, so few
# The example's run with one clip, captured decode, that the counters', the timing's and the prefill runs' tests
# read: one Node load for all. Its warm-up is the shape classes' but the longest chunk's (--warm-up decode), the
# one where the check of long prefill runs is made (tests/test_prefill_runs.py); no count or time of a decode token
# depends on which warm-up ran (test_bench_counters.py compares it with runs warmed up on a second of silence).
# --decode-forms both: the same clip and decode in plain steps after the captured ones, on that load (decode_forms),
# where a --no-graph-capture run was a SwiftShader load of its own
ONE_CLIP_RUN = ("--max-clips", "1", "--warm-up", "decode", "--decode-forms", "both")


def decode_forms(report: dict, stdout: str) -> dict[str, tuple[dict, str]]:
    """A --decode-forms both run as two runs, {form: (report, table)}: captured, the report as is and the table
    up to its plain section; plain, the report with the plain form's keys in place of the captured form's and
    the table from its plain section on."""
    captured_table, plain_table = stdout.split(f"\n{PLAIN_SECTION} ", 1)
    return {"captured": (report, captured_table),
            "plain": ({**report, **report["plain"]}, f"{PLAIN_SECTION} {plain_table}")}


@pytest.fixture(scope="session")
def webgpu_bench(tmp_path_factory):
    """webgpu_bench(site, *options) -> (report, terminal output) of `webbuild bench SITE --ep webgpu
    --swiftshader --decode-tokens 4 --warm-up second OPTIONS`, made once a test run per (site, options) by
    whichever worker asks first: the counters' and the timing's tests read the same runs."""

    def get(site: Path, *options: str) -> tuple[dict, str]:
        key = hashlib.sha256(repr((str(site), options)).encode()).hexdigest()[:16]
        with run_wide(tmp_path_factory, f"bench-{key}") as folder:
            out, log = folder / "bench.json", folder / "stdout.txt"
            if not log.exists():
                # --warm-up second: the shape classes' warm-up is most of a SwiftShader load, and no count or time
                # of a decode token depends on it (the clip and the short decode compile what the long one runs;
                # test_first_use's pages warm every class)
                bench = webbuild("bench", site, "--ep", "webgpu", "--swiftshader", "--decode-tokens",
                                 BENCH_DECODE, "--warm-up", "second", "--json", out, *options, timeout=900)
                assert bench.returncode == 0, bench.stderr
                log.write_text(bench.stdout)
            report, stdout = json.loads(out.read_text()), log.read_text()
        assert report["ep"] == "webgpu", report["gpu"]
        assert report["synthetic_decode"]["ms_per_token"]["n"] == BENCH_DECODE
        return report, stdout

    return get


# ---------------------------------------------------------------- the browser


@pytest.fixture(scope="module")  # per module: two live sync drivers in one thread refuse to start
def playwright():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p


"""webbuild as people install it: a wheel built from the checkout's tracked files, installed into a new venv in
a temporary folder, makes a model.yaml for a copy of the example's export with `webbuild init`, builds it there
and the site passes `webbuild verify`: nothing it reads at run time comes from the checkout.

The wheel is built without build isolation (setuptools of this venv) and the new venv reaches webbuild's
dependencies through a .pth file naming this venv's site-packages (pip installs the wheel alone, --no-deps):
the test needs no package index. setup.py copies onnxruntime-web's files into the wheel from the checkout's
node_modules (npm ci), as a wheel built on a fresh machine gets them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.checkout import copy_tracked
from tests.example_config import EXAMPLE, REPO
from webbuild.site.contract import ORT_MODULES
from webbuild.site.ort_files import VAD_LOCK, lock

pytestmark = [pytest.mark.install, pytest.mark.browser, pytest.mark.slow]


def run(*args, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of the checkout on the path
    r = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{args}: {r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of a copy of the checkout's tracked files (without webbuild/site/onnxruntime-web/: setup.py
    makes it)."""
    src, out = copy_tracked(tmp_path_factory.mktemp("src")), tmp_path_factory.mktemp("wheels")
    (src / "node_modules").symlink_to((REPO / "node_modules").resolve())
    run(sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "--no-index", "-w", out,
        cwd=src)
    return next(out.glob("webbuild_asr-*.whl"))  # the distribution webbuild-asr


def test_the_wheel_holds_what_a_build_reads(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    folder = "webbuild/site/onnxruntime-web"
    ort = {f"{folder}/{name}" for name in lock()["files"]}
    vocabularies = {f"webbuild/train/vocabulary/{p.name}" for p in (REPO / "webbuild/train/vocabulary").glob("*.txt")}
    assert "webbuild/train/vocabulary/en-us.txt" in vocabularies and len(vocabularies) >= 5  # training's word lists
    assert ort | vocabularies | {"webbuild/site/ort.lock.json", "webbuild/tools/pages.yml",
                                 "webbuild/template/index.html.j2", "webbuild/tools/bench/bench.mjs"} <= names
    for name, digest in lock()["files"].items():
        assert hashlib.sha256(zipfile.ZipFile(wheel).read(f"{folder}/{name}")).hexdigest() == digest
    for name, digest in lock(VAD_LOCK)["files"].items():  # Silero VAD's model, vendored the same way
        assert hashlib.sha256(zipfile.ZipFile(wheel).read(f"webbuild/site/silero-vad/{name}")).hexdigest() == digest


def test_the_installed_wheel_inits_builds_and_verifies_outside_the_checkout(wheel, tmp_path):
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    deps = next(venv.glob("lib/python*/site-packages"))
    (deps / "webbuild-test-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")  # appended: after deps
    run(venv / "bin" / "python", "-m", "pip", "install", "--no-deps", "--no-index", wheel, cwd=tmp_path)
    project = tmp_path / "project"
    shutil.copytree(EXAMPLE / "model", project / "tiny-asr")
    shutil.copytree(EXAMPLE / "samples", project / "samples")
    where = run(venv / "bin" / "python", "-c", "import webbuild; print(webbuild.__file__)", cwd=project)
    assert Path(where.stdout.strip()).is_relative_to(deps)

    webbuild = venv / "bin" / "webbuild"
    run(webbuild, "init", "tiny-asr", "--samples", "samples", "--workflow", "pages", cwd=project)
    run(webbuild, "model.yaml", cwd=project)
    assert sorted(p.name for p in (project / "dist" / "ort").iterdir()) == sorted(ORT_MODULES)
    r = run(webbuild, "verify", "dist", "--junit", "verify.xml", "--json", "verify.json", cwd=project)
    assert any(line.startswith("PASS: ") for line in r.stdout.splitlines()), r.stdout[-2000:]
    assert json.loads((project / "verify.json").read_text())["ok"]
    assert "<testsuites" in (project / "verify.xml").read_text()

    # the bench: no Dawn (the `webgpu` npm package is the checkout's dev package), so wasm, saying so
    r = run(webbuild, "bench", "dist", "--decode-tokens", "4", "--max-clips", "1", cwd=project)
    assert "no `webgpu` npm package (Dawn) here: benching on wasm" in r.stderr and "ep wasm" in r.stdout
    r = subprocess.run([webbuild, "bench", "dist", "--ep", "webgpu"], cwd=project, capture_output=True, text=True)
    assert (r.returncode, r.stderr.splitlines()) == (2, [
        "error: bench.mjs failed: Error: --ep webgpu needs the `webgpu` npm package (Dawn), which webbuild's own "
        "install leaves out: run `make setup-check` in the webbuild checkout (npm ci with the dev packages)"])

"""The install split: the main job runs without torch and scipy (`make site` leaves them out), and the
commands that need them say which extra to install instead of showing a traceback.

torch is installed in the test venv, so each test runs a subprocess whose first meta-path finder refuses
torch and transformers, as an environment without them would.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.example_config import REPO
from tests.hidden import HIDE, run_hidden


def test_the_main_job_builds_and_imports_no_torch_and_no_scipy(tmp_path):
    # the build of the embedded example, then every other main-job command's module
    code = """
from webbuild.cli import main
try:
    main()
except SystemExit as e:
    assert not e.code, e.code
import webbuild.pipeline.fuse, webbuild.reference.transcribe, webbuild.tools.serve, webbuild.tools.verify.visits
import webbuild.tools.bench, webbuild.train.clips
print(sorted({m.split(".")[0] for m in sys.modules} & {"torch", "transformers", "scipy"}))
"""
    r = run_hidden(code, "examples/tiny-asr/model.yaml", "-o", str(tmp_path / "dist"),
                   hidden=("torch", "transformers", "scipy"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[]"
    assert (tmp_path / "dist" / "index.html").is_file()


def test_zoo_without_torch_is_one_line_naming_the_extra(tmp_path):
    r = run_hidden("from webbuild.cli import main; main()", "zoo", "tiny", "-o", str(tmp_path / "out"))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert r.stderr.splitlines() == [
        "error: webbuild zoo needs torch and transformers, which the main install leaves out: "
        "pip install -e '.[zoo]' (README.md, Install, says how to get torch's CPU build)"]
    assert not (tmp_path / "out").exists()


def test_training_without_torch_is_one_line_naming_the_extra():
    r = run_hidden("import runpy; runpy.run_module('webbuild.train', run_name='__main__')")
    assert r.returncode == 2
    assert len(r.stderr.splitlines()) == 1 and "pip install -e '.[train]'" in r.stderr, r.stderr


def test_verify_without_playwright_is_one_line_naming_the_extra():
    r = run_hidden("from webbuild.cli import main; main()", "verify", "examples/tiny-asr",
                   hidden=("torch", "transformers", "playwright"))
    assert r.returncode == 2
    assert len(r.stderr.splitlines()) == 1 and "pip install -e '.[verify]'" in r.stderr, r.stderr


def test_a_zoo_module_run_with_dash_m_without_torch_is_one_line(tmp_path):
    # `python -m webbuild.zoo.export_v2 --help`: runpy imports the zoo package outside the command line's handler;
    # torch is hidden by a sitecustomize (the HIDE finder), as `python -m` gives no place for code of the test's
    hide = HIDE.replace("sys.argv.pop(1)", "'torch,transformers'")
    (tmp_path / "sitecustomize.py").write_text(hide)
    r = subprocess.run([sys.executable, "-m", "webbuild.zoo.export_v2", "--help"], capture_output=True, text=True,
                       cwd=REPO, env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}, timeout=120)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.splitlines() == [
        "error: python -m webbuild.zoo.export_v2 needs torch and transformers, which the main install leaves out: "
        "pip install -e '.[zoo]' (README.md, Install, says how to get torch's CPU build)"]

"""setuptools hook: the onnxruntime-web files every built site ships become package data.

Before the package's files are collected (a wheel, `pip install .`, `pip install -e .`), the pinned files
are copied from npm's node_modules/onnxruntime-web into webbuild/site/onnxruntime-web/ and checked by version and
sha256 (webbuild/site/ort.lock.json); Silero VAD's model likewise from node_modules/@ricky0123/vad-web into
webbuild/site/silero-vad/ (webbuild/site/vad.lock.json). Where node_modules lacks them, `npm ci --omit=dev` is run first
(onnxruntime-web only: package.json's devDependencies are for the tests). Everything else is in
pyproject.toml.
"""

import importlib.util
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _ort_files():
    # loaded by path: webbuild's own dependencies are not in pip's build environment
    spec = importlib.util.spec_from_file_location("ort_files", ROOT / "webbuild" / "site" / "ort_files.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithOrt(build_py):
    def run(self):
        ort = _ort_files()
        for lock_path, dest in ort.VENDORED:  # onnxruntime-web, Silero VAD's model
            npm_package = ROOT / "node_modules" / ort.lock(lock_path)["package"]
            if ort.problems(dest, lock_path) and not (npm_package / "package.json").is_file():
                if not shutil.which("npm"):
                    raise SystemExit(f"webbuild: {dest} lacks the pinned {ort.lock(lock_path)['package']} files and "
                                     "npm is not installed; install Node.js (npm) and build again")
                subprocess.run(["npm", "ci", "--omit=dev", "--no-audit", "--no-fund"], cwd=ROOT, check=True)
            try:
                ort.vendor(npm_package, dest, lock_path)
            except ort.OrtFilesError as e:
                raise SystemExit(f"webbuild: {e}") from None
        super().run()


setup(cmdclass={"build_py": BuildPyWithOrt})

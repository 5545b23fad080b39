"""Decoders exported by Hugging Face Optimum, the exporter users publish browser models with, built
here from the real exporter and cached.

The exporter runs in a venv of its own (its transformers is older than the zoo's), created once per
set of EXPORTER_PINS under the cache folder; each family's export is cached under a key of the pins
and of optimum_export.py, so a change to either rebuilds instead of testing stale graphs.

    python -m tests.fusion.exporters    # build every family's export now (`make optimum-fixtures`)
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

# optimum-onnx 0.1.0 exports transformers 4.57 models; its export checks shapes with onnxruntime
EXPORTER_PINS = ("torch==2.13.0", "transformers==4.57.6", "optimum-onnx==0.1.0", "onnxruntime==1.32.0")
FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "phi3", "gemma3", "smollm3", "cohere", "helium", "glm", "phi",
            "stablelm", "nemotron", "olmo", "olmo2", "gemma", "gemma2", "gemma2-softcap", "granite", "stablelm-hd80",
            "llama-hd24",
            "llama-yarn", "llama-llama3")  # optimum_export.FAMILIES, without importing it
SCRIPT = Path(__file__).with_name("optimum_export.py")


def cache_root() -> Path:
    return Path(os.environ.get("WEBBUILD_CACHE") or Path.home() / ".cache" / "webbuild")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on the file `path` (made when missing): test workers and sessions sharing the cache
    make each fixture once, one waiting for the other."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def made_once(out: Path, make: Callable[[Path], None], done: str) -> Path:
    """`out`, made by make(folder) into a temporary folder beside it and renamed into place whole when
    out/done is missing, under a lock beside it: no reader ever sees it half written."""
    if not (out / done).exists():
        with locked(out.parent / f".{out.name}.lock"):
            if not (out / done).exists():
                with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
                    make(Path(tmp) / out.name)
                    shutil.rmtree(out, ignore_errors=True)
                    os.replace(Path(tmp) / out.name, out)
    return out


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
    return h.hexdigest()[:16]


def exporter_python() -> Path:
    """The exporter venv's python, the venv made first when missing (about a minute: torch's CPU wheel,
    transformers, optimum-onnx, onnxruntime)."""
    venv = cache_root() / f"optimum-venv-{_digest(' '.join(EXPORTER_PINS).encode())}"
    python = venv / "bin" / "python"
    if (venv / ".installed").is_file():
        return python
    with locked(venv.with_name(f".{venv.name}.lock")):  # made in place (a venv cannot move): one maker
        if not (venv / ".installed").is_file():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                            *EXPORTER_PINS], check=True)
            (venv / ".installed").touch()
    return python


def export(family: str) -> Path:
    """`family`'s Optimum export folder (model.onnx, config.json), exported now when not cached."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
    root = cache_root() / "optimum-fixtures" / _digest(" ".join(EXPORTER_PINS).encode(), SCRIPT.read_bytes())

    def make(folder: Path) -> None:
        # the exporter's output (tracer warnings, mostly) is shown only when it fails
        run = subprocess.run([str(exporter_python()), str(SCRIPT), family, str(folder)], capture_output=True,
                             text=True)
        if run.returncode:
            raise RuntimeError(f"exporting {family} failed:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}")

    return made_once(root / family, make, "model.onnx")


if __name__ == "__main__":
    from concurrent.futures import ThreadPoolExecutor

    exporter_python()  # the venv once, before the exports share it
    # each export is a subprocess that mostly waits on one core: one at a time per core
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for name, out in zip(FAMILIES, pool.map(export, FAMILIES)):
            print(f"{name}: {out}", flush=True)

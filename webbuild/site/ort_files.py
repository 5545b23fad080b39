"""The onnxruntime-web files every built site ships, as package data of webbuild.

A site self-hosts onnxruntime-web's WebGPU module, its wasm glue and its wasm binary (webbuild.site.contract
ORT_MODULES, ORT_WASM), at the version and sha256 of ort.lock.json beside this module. They live in
webbuild/site/onnxruntime-web/, inside the package, so that an installed wheel builds sites anywhere without a
checkout or npm. They are put there once from npm's pinned copy (`npm ci --omit=dev`, package-lock.json):
by setup.py when a wheel or an editable install is built, or by `python -m webbuild.site.ort_files`
(`make ort`); `vendor` refuses another version or other bytes. Why vendored at build time rather than
fetched by the installed tool: a wheel then works offline and on a machine without Node, and its bytes are
checked once, where they are made.

Silero VAD's ONNX model (speech detection, webbuild.reference.vad and runtime/vad.js) is vendored the same way
from npm's pinned @ricky0123/vad-web into webbuild/site/silero-vad/ (vad.lock.json): VENDORED lists both.

Standard library only: setup.py loads this file by path inside pip's build environment, before webbuild's
dependencies exist.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from functools import cache
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOCK = HERE / "ort.lock.json"
ORT_FILES_DIR = HERE / "onnxruntime-web"  # package data (pyproject.toml), ignored by git
VAD_LOCK = HERE / "vad.lock.json"
VAD_FILES_DIR = HERE / "silero-vad"  # package data (pyproject.toml), ignored by git
VENDORED = ((LOCK, ORT_FILES_DIR), (VAD_LOCK, VAD_FILES_DIR))  # (lock, package data folder) of each npm package
FIX = "run `make ort` (or `python -m webbuild.site.ort_files` after `npm ci --omit=dev`) in the webbuild checkout"


class OrtFilesError(Exception):
    """The shipped onnxruntime-web files are missing or not the pinned ones; the message says what to run."""


def lock(path: Path = LOCK) -> dict:
    """{"package", "version", "files": {name: sha256}} of ort.lock.json (or another lock)."""
    return json.loads(path.read_text())


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def problems(folder: Path, lock_path: Path = LOCK) -> list[str]:
    """What differs between `folder` and the lock: each file missing or of other bytes (empty: all good)."""
    out = []
    pin = lock(lock_path)
    for name, digest in pin["files"].items():
        path = folder / name
        if not path.is_file():
            out.append(f"{path} is missing")
        elif sha256(path) != digest:
            out.append(f"{path} is not {pin['package']} {pin['version']}'s file (sha256 differs)")
    return out


@cache
def ort_dir() -> Path:
    """webbuild/site/onnxruntime-web/, checked against the lock once a process."""
    if found := problems(ORT_FILES_DIR):
        raise OrtFilesError(f"{found[0]}; {FIX}")
    return ORT_FILES_DIR


@cache
def vad_dir() -> Path:
    """webbuild/site/silero-vad/ (Silero VAD's model), checked against vad.lock.json once a process."""
    if found := problems(VAD_FILES_DIR, VAD_LOCK):
        raise OrtFilesError(f"{found[0]}; {FIX}")
    return VAD_FILES_DIR


def vendor(npm_package: Path, dest: Path = ORT_FILES_DIR, lock_path: Path = LOCK) -> list[str]:
    """Copy the locked files from an installed npm package (node_modules/onnxruntime-web) into `dest`,
    each checked by version and sha256; returns the names copied (none when `dest` already holds them)."""
    pin = lock(lock_path)
    lock_name = f"webbuild/site/{lock_path.name}"
    if not problems(dest, lock_path):
        return []
    try:
        have = json.loads((npm_package / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        raise OrtFilesError(f"{npm_package} is missing: run `npm ci --omit=dev` in the webbuild checkout "
                            f"(package-lock.json pins {pin['package']} {pin['version']})") from None
    if have != pin["version"]:
        raise OrtFilesError(f"{npm_package} is version {have}, {lock_name} pins "
                            f"{pin['version']}; run `npm ci --omit=dev`")
    dest.mkdir(parents=True, exist_ok=True)
    for name, digest in pin["files"].items():
        tmp = dest / f".{name}.{os.getpid()}"
        shutil.copyfile(npm_package / "dist" / name, tmp)
        if sha256(tmp) != digest:
            tmp.unlink()
            raise OrtFilesError(f"{npm_package / 'dist' / name}: sha256 is not the one {lock_name} "
                                f"records for {pin['version']}; reinstall it with `npm ci --omit=dev`")
        os.replace(tmp, dest / name)  # one step: a concurrent reader sees the old file or the new one
    return list(pin["files"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Copy the pinned onnxruntime-web files and Silero VAD's model a site "
                                             "ships from npm's node_modules into the package "
                                             "(webbuild/site/onnxruntime-web/, webbuild/site/silero-vad/).")
    ap.add_argument("--node-modules", type=Path, default=Path("node_modules"),
                    help="npm's installed packages (default: %(default)s)")
    args = ap.parse_args(argv)
    for lock_path, dest in VENDORED:
        pin = lock(lock_path)
        try:
            copied = vendor(args.node_modules / pin["package"], dest, lock_path)
        except OrtFilesError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"{pin['package']} {pin['version']}: {len(copied)} files copied into {dest}" if copied
              else f"{dest} holds {pin['package']} {pin['version']}'s files")
    return 0


if __name__ == "__main__":
    sys.exit(main())

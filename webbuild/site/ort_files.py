"""The onnxruntime-web files every built site ships, as package data of webbuild.

A site self-hosts onnxruntime-web's WebGPU module, its wasm glue and its wasm binary (webbuild.site.contract
ORT_MODULES, ORT_WASM), at the version and sha256 of ort.lock.json beside this module. They live in
webbuild/site/onnxruntime-web/, inside the package, so that an installed wheel builds sites anywhere without a
checkout or npm. They are put there once from npm's pinned copy (`npm ci --omit=dev`, package-lock.json):
by setup.py when a wheel or an editable install is built, or by `python -m webbuild.site.ort_files`
(`make ort`); `vendor` refuses another version or other bytes. Why vendored at build time rather than
fetched by the installed tool: a wheel then works offline and on a machine without Node, and its bytes are
checked once, where they are made.

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
FIX = "run `make ort` (or `python -m webbuild.site.ort_files` after `npm ci --omit=dev`) in the webbuild checkout"


class OrtFilesError(Exception):
    """The shipped onnxruntime-web files are missing or not the pinned ones; the message says what to run."""


def lock() -> dict:
    """{"package", "version", "files": {name: sha256}} of ort.lock.json."""
    return json.loads(LOCK.read_text())


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def problems(folder: Path) -> list[str]:
    """What differs between `folder` and the lock: each file missing or of other bytes (empty: all good)."""
    out = []
    for name, digest in lock()["files"].items():
        path = folder / name
        if not path.is_file():
            out.append(f"{path} is missing")
        elif sha256(path) != digest:
            out.append(f"{path} is not {lock()['package']} {lock()['version']}'s file (sha256 differs)")
    return out


@cache
def ort_dir() -> Path:
    """webbuild/site/onnxruntime-web/, checked against the lock once a process."""
    if found := problems(ORT_FILES_DIR):
        raise OrtFilesError(f"{found[0]}; {FIX}")
    return ORT_FILES_DIR


def vendor(npm_package: Path, dest: Path = ORT_FILES_DIR) -> list[str]:
    """Copy the locked files from an installed npm package (node_modules/onnxruntime-web) into `dest`,
    each checked by version and sha256; returns the names copied (none when `dest` already holds them)."""
    pin = lock()
    if not problems(dest):
        return []
    try:
        have = json.loads((npm_package / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        raise OrtFilesError(f"{npm_package} is missing: run `npm ci --omit=dev` in the webbuild checkout "
                            f"(package-lock.json pins {pin['package']} {pin['version']})") from None
    if have != pin["version"]:
        raise OrtFilesError(f"{npm_package} is version {have}, webbuild/site/ort.lock.json pins "
                            f"{pin['version']}; run `npm ci --omit=dev`")
    dest.mkdir(parents=True, exist_ok=True)
    for name, digest in pin["files"].items():
        tmp = dest / f".{name}.{os.getpid()}"
        shutil.copyfile(npm_package / "dist" / name, tmp)
        if sha256(tmp) != digest:
            tmp.unlink()
            raise OrtFilesError(f"{npm_package / 'dist' / name}: sha256 is not the one webbuild/site/ort.lock.json "
                                f"records for {pin['version']}; reinstall it with `npm ci --omit=dev`")
        os.replace(tmp, dest / name)  # one step: a concurrent reader sees the old file or the new one
    return list(pin["files"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Copy the pinned onnxruntime-web files a site ships from npm's "
                                             "node_modules into the package (webbuild/site/onnxruntime-web/).")
    ap.add_argument("--from", dest="npm_package", type=Path, default=Path("node_modules") / lock()["package"],
                    help="the installed npm package (default: %(default)s)")
    args = ap.parse_args(argv)
    try:
        copied = vendor(args.npm_package)
    except OrtFilesError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    pin = lock()
    print(f"{pin['package']} {pin['version']}: {len(copied)} files copied into {ORT_FILES_DIR}" if copied
          else f"{ORT_FILES_DIR} holds {pin['package']} {pin['version']}'s files")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The folder of a bare page for browser tests that drive the site's runtime modules directly: the
runtime as webbuild/template ships it and the site's onnxruntime-web files, as a build copies them."""

from __future__ import annotations

import shutil
from pathlib import Path

from webbuild.pipeline.render import TEMPLATE_DIR, ort_dist
from webbuild.site.contract import ORT_DIR, ORT_MODULE, ORT_MODULES, ORT_WASM

ORT_URL = f"./{ORT_DIR}/{ORT_MODULE}"  # what the page imports onnxruntime-web from


def runtime_page(root: Path, title: str) -> Path:
    """Fill `root` (created or empty) with index.html, runtime/ and ORT_DIR; returns `root`."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "index.html").write_text(f"<!doctype html><title>{title}</title>\n")
    shutil.copytree(TEMPLATE_DIR / "runtime", root / "runtime")
    (root / ORT_DIR).mkdir()
    for name in (*ORT_MODULES, ORT_WASM):
        shutil.copyfile(ort_dist() / name, root / ORT_DIR / name)
    return root

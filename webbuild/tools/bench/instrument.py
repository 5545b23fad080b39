"""The bench-only copy of a built site that `webbuild bench --runtime browser` serves: the site's own
worker.js with the WebGPU call counters and timing (counters.mjs, timing.mjs) in front and the synthetic-decode hook
(synth_hook.js) behind, every other file hard-linked. The shipped site is never written."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from webbuild.tools.bench import HARNESSES


def harness_script(name: str, install: str) -> str:
    """A harness module as a script to prepend to a module worker: its `export`s dropped, then `install`."""
    text = (HARNESSES / name).read_text()
    return re.sub(r"^export ", "", text, flags=re.M) + f"\n{install}\n"


def instrumented_worker(worker_js: str) -> str:
    """A site's worker.js for benching only: timing.mjs (off until a timed decode) and counters.mjs in front,
    wrapping the WebGPU calls before onnxruntime-web makes its device, in dawn.mjs's order; synth_hook.js
    behind (self.__wbSynth(n), self.__wbCountedSynth(n), self.__wbTimedSynth(n): bench.mjs's synthetic
    decodes in the worker, for Playwright's Worker.evaluate)."""
    return (harness_script("timing.mjs", "installGpuTiming(self, { on: false });")
            + harness_script("counters.mjs", "installGpuCounters(self);")
            + worker_js + "\n" + (HARNESSES / "synth_hook.js").read_text())


def counted_site(dist: Path, dest: Path) -> Path:
    """A bench-only copy of the built site `dist` at `dest` (which must not exist): every file hard-linked
    where the file system allows (copied otherwise; symlinks followed, since the preview server refuses
    links leaving its root), worker.js a new file from instrumented_worker(). `dist` is left as it is."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(dist, dest, copy_function=link)
    worker = dest / "worker.js"
    worker.unlink()  # a hard link to the site's own file: replaced, never written through
    worker.write_text(instrumented_worker((dist / "worker.js").read_text()))
    return dest


def counted_site_parent(dist: Path) -> str | None:
    """Where to make counted_site's temporary folder: the system's temp folder when it is on dist's file
    system (hard links work there), else dist's parent folder if writable, else the temp folder (copies)."""
    tmp = tempfile.gettempdir()
    if os.stat(tmp).st_dev == os.stat(dist).st_dev:
        return None
    parent = dist.resolve().parent
    return str(parent) if os.access(parent, os.W_OK) else None

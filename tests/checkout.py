"""A copy of the checkout as a fresh clone has it: every tracked file, as the working tree holds it now."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.example_config import REPO


def copy_tracked(dest: Path) -> Path:
    """`dest` (created) with each file `git ls-files` lists, its working-tree content; returns `dest`."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True)
    for name in filter(None, tracked.stdout.split("\0")):
        if (REPO / name).is_file():  # a file deleted in the working tree is not copied
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    return dest

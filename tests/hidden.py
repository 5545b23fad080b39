"""Python in a subprocess that cannot import some installed packages, as an environment without them."""

from __future__ import annotations

import subprocess
import sys

from tests.example_config import REPO

# the first meta-path finder refuses the packages named in argv[1] (comma-separated), and their modules
HIDE = """
import sys
HIDDEN = set(sys.argv.pop(1).split(","))
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Hide())
"""


def run_hidden(code: str, *args: str, hidden=("torch", "transformers"), timeout: float = 300,
               **kw) -> subprocess.CompletedProcess:
    """`python -c CODE ARGS` from the repository root, the `hidden` packages refused."""
    return subprocess.run([sys.executable, "-c", HIDE + code, ",".join(hidden), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, **kw)

"""Qwen3-ASR source exports made from the upstream torch code (`webbuild zoo`).

Every module here but presets needs torch and transformers (the `zoo` extra); importing the package
without them is a one-line error naming the extra rather than a traceback, `--help` of a module run with
`python -m webbuild.zoo.NAME` included (exit code 2).
"""

import sys

from webbuild.errors import ExtraError, require_extra

try:
    require_extra("zoo", "webbuild zoo", "torch", "transformers")
except ExtraError as e:
    # `python -m webbuild.zoo.NAME`: runpy imports this package while argv[0] is still "-m", outside any
    # handler of webbuild's; say it in one line and stop, as the command line does
    if sys.argv[:1] == ["-m"] and "-m" in sys.orig_argv:
        module = sys.orig_argv[sys.orig_argv.index("-m") + 1]
        ExtraError(str(e).replace("webbuild zoo", f"python -m {module}", 1)).show()
        sys.exit(e.exit_code)
    raise

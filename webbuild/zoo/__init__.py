"""Qwen3-ASR source exports made from the upstream torch code (`webbuild zoo`).

Every module here but presets needs torch and transformers (the `zoo` extra); importing the package
without them is a one-line error naming the extra rather than a traceback.
"""

from webbuild.errors import require_extra

require_extra("zoo", "webbuild zoo", "torch", "transformers")

import sys

from webbuild.errors import ExtraError, require_extra

# a one-line error without the `train` extra; outside click, so shown here (clips.py needs no torch)
try:
    require_extra("train", "python -m webbuild.train", "torch", "transformers", "scipy")
except ExtraError as e:
    e.show()
    sys.exit(e.exit_code)

from webbuild.train.train import main  # noqa: E402

main()

"""webbuild: a Qwen3-ASR ONNX export in, a static speech-recognition website out.

The packages, by role (docs/architecture.md draws the house): `cli` wires the commands; `pipeline`
runs the stages from model.yaml to dist/; `fusion` and `quantize` rewrite graphs on the helpers
of `graph`, and `forms` derives the shipped forms of them (step, adapted, wasm twin, WebGPU, mel
front-end); `site` is the built site's formats; `reference` is the Python runtime the browser is
checked against; `tools` serve, bench and verify a built site; `zoo` and `train` make models.
"""

from __future__ import annotations

from importlib import metadata

# The distribution's name on a package index ("webbuild" there is an unrelated project): what `pip install` and
# the workflow of `webbuild init --workflow pages` name. The command and the import package stay `webbuild`.
DISTRIBUTION = "webbuild-asr"


def version() -> str:
    """The installed distribution's version."""
    return metadata.version(DISTRIBUTION)

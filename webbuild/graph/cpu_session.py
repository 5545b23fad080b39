"""The one way webbuild runs a graph on the build machine's CPU: an onnxruntime CPU session that logs only errors
and whose threads sleep between runs instead of spinning. The build's check, the Python reference, fusion's
parity and validation and the zoo's export check make many short runs, often beside other work (a CI box's
tests, a browser), whose cores spinning threads would take: the example's check took 16-24 s spinning and 7.6-9 s
not, on a 2-core box beside a test run."""

from __future__ import annotations

import onnxruntime as ort

PROVIDERS = ["CPUExecutionProvider"]


def options(config: dict[str, str] | None = None) -> ort.SessionOptions:
    """The options: errors only, no spinning, and each of `config`'s session config entries."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    for key, value in (config or {}).items():
        opts.add_session_config_entry(key, value)
    return opts


def session(model: str | bytes, opts: ort.SessionOptions | None = None) -> ort.InferenceSession:
    """A session of `model` (a path, or a serialized ModelProto) with `opts` (options() where None)."""
    return ort.InferenceSession(model, opts or options(), providers=PROVIDERS)

"""A pytest plugin for tests/test_lanes.py (`-p tests.lanes_probe`): writes the tests a run selected, each
with its fixtures (all it uses, through other fixtures too) and markers, as JSON to $LANES_PROBE_JSON."""

from __future__ import annotations

import json
import os


def pytest_collection_finish(session):
    tests = {item.nodeid: {"fixtures": sorted(getattr(item, "fixturenames", ())),
                           "markers": sorted({m.name for m in item.iter_markers()})} for item in session.items}
    with open(os.environ["LANES_PROBE_JSON"], "w") as f:
        json.dump(tests, f)

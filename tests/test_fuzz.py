"""Random corruptions of every input the commands read (tests/fuzz.py): each outcome is exit 0 or one
`error:` line with exit 2 naming the user's file, with no traceback and no partial output. A fixed-seed
budget of FUZZ_CASES cases here (200: `make test`); `make check` runs fewer and `make fuzz` more
($WEBBUILD_FUZZ_CASES), the latter writing the tally ($WEBBUILD_FUZZ_REPORT)."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from tests.fuzz import cases, run_case

FUZZ_CASES = int(os.environ.get("WEBBUILD_FUZZ_CASES", "200"))


@pytest.mark.slow
def test_no_corruption_gives_a_traceback_or_a_partial_output(example_dist):
    tally: Counter = Counter()
    failures: list[str] = []
    start = time.monotonic()

    # derandomize: the same cases every run (a fixed seed); every failure is listed, none shrunk (a case is
    # small already: one edit of one file)
    @settings(max_examples=FUZZ_CASES, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    @given(cases())
    def one(case):
        try:
            run_case(case, example_dist, tally)
        except AssertionError as exc:
            failures.append(f"{case}: {str(exc)[:600]}")

    one()
    seconds = time.monotonic() - start
    ran = sum(tally.values())
    summary = {"cases": ran + len(failures), "seconds": round(seconds, 1), "failures": failures,
               "outcomes": {" ".join(key): n for key, n in sorted(tally.items())}}
    print(json.dumps(summary, indent=1))
    if path := os.environ.get("WEBBUILD_FUZZ_REPORT"):
        Path(path).write_text(json.dumps(summary, indent=1) + "\n")
    assert failures == []
    assert ran >= FUZZ_CASES

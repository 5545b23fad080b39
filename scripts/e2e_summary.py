"""The last lines of `make e2e` (and so of `make test`): PASS/FAIL counts (with the clips that passed under
the margin, webbuild/tools/verify/tokens.py), a RATE line per source sample rate of the clips (tokens equal
to the Python reference per provider, the largest margin drift), a MARGIN line per clip passed under the
margin and a FAIL line per failure.

    python scripts/e2e_summary.py e2e-report.json --seconds 162 --rc 0

The full report (per clip timings, visits, checks) stays in the JSON file; printing it buried the verdict
under ~630 lines.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from webbuild.tools.verify.report import failures, per_rate, under_margin, verdict


def summary(report: dict, path: str) -> list[str]:
    return [f"{verdict(report)} (full report: {path})", *per_rate(report), *under_margin(report), *failures(report)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report", help="the JSON report of `webbuild verify --json` (make e2e: e2e-report.json)")
    ap.add_argument("--seconds", type=int, help="how long webbuild verify took")
    ap.add_argument("--rc", type=int, default=0, help="webbuild verify's exit code")
    args = ap.parse_args()
    took = f" in {args.seconds} s" if args.seconds is not None else ""
    print(f"--- e2e: webbuild verify exited {args.rc}{took}")
    path = Path(args.report)
    if not path.is_file():
        print(f"FAIL: no {path}: webbuild verify stopped before writing its report (its error is above)")
        return
    print("\n".join(summary(json.loads(path.read_text()), str(path))))


if __name__ == "__main__":
    main()

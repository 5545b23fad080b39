"""The verify report as a terminal table and as a JSON file."""

from __future__ import annotations

import json
from pathlib import Path

from webbuild.text import plural

COLUMNS = ("clip", "run", "ep", "expected", "got", "WER", "TTFT ms", "decode tok/s", "ok")


def _cut(text: str | None, width: int = 36) -> str:
    text = "" if text is None else text
    return text if len(text) <= width else text[:width - 1] + "…"


def _num(value, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def table(report: dict) -> str:
    rows = [(_cut(r["clip"], 24), r["run"], r["ep"], _cut(r["expected"]), _cut(r["got"]), _num(r["wer"], ".2f"),
             _num(r["ttft_ms"], ".0f"), _num(r["decode_tokens_per_s"], ".1f"), "ok" if r["ok"] else "FAIL")
            for r in report["clips"]]
    widths = [max(len(str(c)) for c in col) for col in zip(COLUMNS, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [line(COLUMNS), line("-" * w for w in widths), *map(line, rows), ""]
    out += [f"{'ok  ' if c['ok'] else 'FAIL'} {c['name']}" + (f" ({c['detail']})" if c["detail"] else "")
            for c in report["checks"]]
    load = report["load_ms"]
    out.append(f"\n{report['url']} on {report['browser']}: {report['ep']} ({report['variant']}, {report['adapter']}); "
               f"load cold {load['cold']} ms, warm {load['warm']} ms; {report['duration_s']} s")
    refs = [r for r in report["clips"] if r["reference"] is not None]
    if refs:
        out.append(f"browser text == Python reference (same build) on "
                   f"{report['reference_equal']}/{plural(len(refs), 'clip')}")
    if any(r["run"] == "clips" for r in report["clips"]):
        out.append(f"--clips corpus WER against the .txt transcripts: {100 * report['clips_wer']:.2f}%")
    passed = sum(r["ok"] for r in report["clips"])
    out.append(f"{'PASS' if report['ok'] else 'FAIL'}: {passed}/{plural(len(report['clips']), 'clip')}, "
               f"{sum(c['ok'] for c in report['checks'])}/{plural(len(report['checks']), 'check')}")
    return "\n".join(out)


def write_json(report: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")

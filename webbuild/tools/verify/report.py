"""The verify report as a terminal table, a JSON file and a JUnit XML file."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
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
    out += [f"ok   {c['name']}" + (f" ({c['detail']})" if c["detail"] else "") for c in report["checks"] if c["ok"]]
    load = report["load_ms"]
    out.append(f"\n{report['url']} on {report['browser']}: {report['ep']} ({report['variant']}, {report['adapter']}); "
               f"load cold {load['cold']} ms, warm {load['warm']} ms; {report['duration_s']} s")
    refs = [r for r in report["clips"] if r["reference"] is not None]
    if refs:
        out.append(f"browser text == Python reference (same build) on "
                   f"{report['reference_equal']}/{plural(len(refs), 'clip')}")
    if any(r["run"] == "clips" for r in report["clips"]):
        out.append(f"--clips corpus WER against the .txt transcripts: {100 * report['clips_wer']:.2f}%")
    return "\n".join(out)


def verdict(report: dict) -> str:
    clips, checks = report["clips"], report["checks"]
    return (f"{'PASS' if report['ok'] else 'FAIL'}: {sum(r['ok'] for r in clips)}/{plural(len(clips), 'clip')}, "
            f"{sum(c['ok'] for c in checks)}/{plural(len(checks), 'check')}")


def failures(report: dict) -> list[str]:
    """One line per failed clip and check with its reason: the last lines of `webbuild verify` and `make e2e`."""
    return ([f"FAIL clip {r['clip']} ({r['run']}, {r['ep']}): {r['reason']}" for r in report["clips"] if not r["ok"]]
            + [f"FAIL check {c['name']}" + (f": {c['detail']}" if c["detail"] else "")
               for c in report["checks"] if not c["ok"]])


def write_json(report: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")


# characters XML 1.0 cannot hold at all, even escaped (a transcript of garbage bytes could carry them)
_NOT_XML = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _suite(parent, name: str, cases: list[tuple[str, str, float | None, str | None, str]]) -> None:
    """A <testsuite> of (classname, name, seconds, failure reason or None, failure text) cases."""
    suite = ET.SubElement(parent, "testsuite", name=name, tests=str(len(cases)),
                          failures=str(sum(c[3] is not None for c in cases)), errors="0", skipped="0",
                          time=f"{sum(c[2] or 0 for c in cases):.3f}")
    for classname, case_name, seconds, reason, text in cases:
        case = ET.SubElement(suite, "testcase", classname=classname, name=_NOT_XML.sub("?", case_name))
        if seconds is not None:
            case.set("time", f"{seconds:.3f}")
        if reason is not None:
            failure = ET.SubElement(case, "failure", message=_NOT_XML.sub("?", reason), type="webbuild.verify")
            failure.text = _NOT_XML.sub("?", text)


def junit(report: dict) -> str:
    """JUnit XML as CI systems read it: a <testsuites> with one <testsuite> of the clips (a case per clip
    and run, its time the page's transcription time) and one of the checks (a case per check); a failure's
    message is its one-line reason."""
    clips = [(f"webbuild.verify.clips.{r['run'].replace(' ', '_')}", f"{r['clip']} [{r['ep']}]",
              r["total_ms"] / 1000 if r.get("total_ms") is not None else None, r.get("reason"),
              f"expected:  {r['expected']}\ngot:       {r['got']}\nreference: {r['reference']}\n"
              f"WER {r['wer']:.3f} (bound {r['max_wer']}); error: {r['error']}")
             for r in report["clips"]]
    checks = [("webbuild.verify.checks", c["name"], None, None if c["ok"] else c["detail"] or "failed",
               c["detail"]) for c in report["checks"]]
    root = ET.Element("testsuites", name=f"webbuild verify {report['url']}", tests=str(len(clips) + len(checks)),
                      failures=str(sum(c[3] is not None for c in clips + checks)), errors="0",
                      time=f"{report['duration_s']:.1f}")
    _suite(root, "clips", clips)
    _suite(root, "checks", checks)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(report: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(junit(report), encoding="utf-8")

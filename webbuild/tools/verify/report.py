"""The verify report as a terminal table, a JSON file and a JUnit XML file."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import NamedTuple

from webbuild.text import plural

COLUMNS = ("clip", "run", "ep", "expected", "got", "WER", "tokens", "TTFT ms", "decode tok/s", "ok")


def _cut(text: str | None, width: int = 36) -> str:
    text = "" if text is None else text
    return text if len(text) <= width else text[:width - 1] + "…"


def _num(value, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def _tokens(r: dict) -> str:
    """The tokens column: against the Python reference, '=' (equal), 'tie@N' (first differing at position
    N, passed under the margin), '≠@N' (differing), '–' (not compared)."""
    if r.get("reference_tokens") is None or r["error"] is not None:
        return "–"
    diff = r["difference"]
    return "=" if diff is None else f"{'tie' if diff['under_margin'] else '≠'}@{diff['position']}"


def table(report: dict) -> str:
    rows = [(_cut(r["clip"], 24), r["run"], r["ep"], _cut(r["expected"]), _cut(r["got"]), _num(r["wer"], ".2f"),
             _tokens(r),
             _num(r["ttft_ms"], ".0f"), _num(r["decode_tokens_per_s"], ".1f"), "ok" if r["ok"] else "FAIL")
            for r in report["clips"]]
    widths = [max(len(str(c)) for c in col) for col in zip(COLUMNS, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [line(COLUMNS), line("-" * w for w in widths), *map(line, rows), ""]
    out += [f"ok   {c['name']}" + (f" ({c['detail']})" if c["detail"] else "") for c in report["checks"] if c["ok"]]
    load = report["load_ms"]
    out.append(f"\n{report['url']} on {report['browser']}: {report['ep']} ({report['variant']}, {report['gpu']}); "
               f"load cold {load['cold']} ms, warm {load['warm']} ms; {report['duration_s']} s")
    refs = [r for r in report["clips"] if r["reference"] is not None]
    if refs:
        out.append(f"browser text == Python reference (same build) on "
                   f"{report['reference_equal']}/{plural(len(refs), 'clip')}")
    if report.get("tokens_compared"):
        drift = ", ".join(f"{ep} {d:.4f}" for ep, d in report["margin_drift"].items())
        out.append(f"browser tokens == Python reference on {report['reference_tokens_equal']}/"
                   f"{plural(report['tokens_compared'], 'clip')}; {report['passed_under_margin']} passed under the "
                   f"margin (first difference with margins < {report['max_tie_margin']}); largest margin drift "
                   f"before a difference: {drift or '–'}")
    if any(r["run"] == "clips" for r in report["clips"]):
        out.append(f"--clips corpus WER against the .txt transcripts: {100 * report['clips_wer']:.2f}%")
    return "\n".join(out)


def verdict(report: dict) -> str:
    """PASS/FAIL with the clips and checks that passed; where tokens were compared with the Python
    reference, how many clips passed only under the margin (tokens.py)."""
    clips, checks = report["clips"], report["checks"]
    tie = f" ({report['passed_under_margin']} passed under the margin)" if report.get("tokens_compared") else ""
    return (f"{'PASS' if report['ok'] else 'FAIL'}: {sum(r['ok'] for r in clips)}/{plural(len(clips), 'clip')}{tie}, "
            f"{sum(c['ok'] for c in checks)}/{plural(len(checks), 'check')}")


def per_rate(report: dict) -> list[str]:
    """A line per source rate (and channel count) of the compared clips: per provider, the clips whose tokens
    equal the Python reference's and the largest margin drift."""
    groups: dict[tuple, list[dict]] = {}
    for r in report["clips"]:
        if r.get("rate") and r.get("reference_tokens") is not None and r["error"] is None:
            groups.setdefault((r["rate"], r.get("channels") or 1), []).append(r)
    lines = []
    for (rate, channels), rows in sorted(groups.items()):
        parts = []
        for ep in sorted({r["ep"] for r in rows}):
            mine = [r for r in rows if r["ep"] == ep]
            drift = max((r["margin_drift"] for r in mine if r["margin_drift"] is not None), default=None)
            parts.append(f"{ep} {sum(r['difference'] is None for r in mine)}/{len(mine)} tokens equal, "
                         f"margin drift {_num(drift, '.4f')}")
        lines.append(f"RATE {rate} Hz{' x' + str(channels) if channels > 1 else ''}: {'; '.join(parts)}")
    return lines


def under_margin(report: dict) -> list[str]:
    """One line per clip that passed under the margin, with its first differing position and margins."""
    return [f"MARGIN clip {r['clip']} ({r['run']}, {r['ep']}): {r['difference']['summary']}"
            for r in report["clips"] if r["ok"] and r.get("under_margin")]


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


class Case(NamedTuple):
    """A JUnit <testcase>: a failure reason (None: passed) with its text, and a note for <system-out>."""

    classname: str
    name: str
    seconds: float | None
    reason: str | None
    text: str
    note: str | None = None


def _xml(text: str) -> str:
    return _NOT_XML.sub("?", text)


def _suite(parent, name: str, cases: list[Case], properties: dict | None = None) -> None:
    """A <testsuite> of `cases`, its <properties> first as the JUnit schema orders them."""
    suite = ET.SubElement(parent, "testsuite", name=name, tests=str(len(cases)),
                          failures=str(sum(c.reason is not None for c in cases)), errors="0", skipped="0",
                          time=f"{sum(c.seconds or 0 for c in cases):.3f}")
    if properties:
        props = ET.SubElement(suite, "properties")
        for key, value in properties.items():
            ET.SubElement(props, "property", name=key, value=str(value))
    for c in cases:
        case = ET.SubElement(suite, "testcase", classname=c.classname, name=_xml(c.name))
        if c.seconds is not None:
            case.set("time", f"{c.seconds:.3f}")
        if c.reason is not None:
            failure = ET.SubElement(case, "failure", message=_xml(c.reason), type="webbuild.verify")
            failure.text = _xml(c.text)
        if c.note is not None:
            ET.SubElement(case, "system-out").text = _xml(c.note)


def _clip_case(r: dict) -> Case:
    diff = r.get("difference")
    text = (f"expected:  {r['expected']}\ngot:       {r['got']}\nreference: {r['reference']}\n"
            f"WER {r['wer']:.3f} (bound {r['max_wer']}); error: {r['error']}"
            + (f"\n{diff['summary']}" if diff else ""))
    note = f"passed under the margin: {diff['summary']}" if r["ok"] and r.get("under_margin") and diff else None
    return Case(f"webbuild.verify.clips.{r['run'].replace(' ', '_')}", f"{r['clip']} [{r['ep']}]",
                r["total_ms"] / 1000 if r.get("total_ms") is not None else None, r.get("reason"), text, note)


def junit(report: dict) -> str:
    """JUnit XML as CI systems read it: a <testsuites> with one <testsuite> of the clips (a case per clip
    and run, its time the page's transcription time) and one of the checks (a case per check); a failure's
    message is its one-line reason. Where tokens were compared with the Python reference, the clips suite's
    properties carry `passed_under_margin` (the count) and `max_tie_margin`, and each clip passed under the
    margin says where its tokens differ in its <system-out>."""
    clips = [_clip_case(r) for r in report["clips"]]
    checks = [Case("webbuild.verify.checks", c["name"], None, None if c["ok"] else c["detail"] or "failed",
                   c["detail"]) for c in report["checks"]]
    root = ET.Element("testsuites", name=f"webbuild verify {report['url']}", tests=str(len(clips) + len(checks)),
                      failures=str(sum(c.reason is not None for c in clips + checks)), errors="0",
                      time=f"{report['duration_s']:.1f}")
    props = ({"passed_under_margin": report["passed_under_margin"], "max_tie_margin": report["max_tie_margin"]}
             if report.get("tokens_compared") else None)
    _suite(root, "clips", clips, props)
    _suite(root, "checks", checks)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(report: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(junit(report), encoding="utf-8")

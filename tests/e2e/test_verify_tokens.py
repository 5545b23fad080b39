"""`webbuild verify`'s token comparison with the Python reference (webbuild/tools/verify/tokens.py) on
crafted token lists: where the lists first part, when a difference passes under the margin, and how the
report (table, verdict, JUnit, the e2e summary) counts such clips. The browser runs are in test_verify.py."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from webbuild.reference.transcribe import pick
from webbuild.tools.verify.report import junit, table, under_margin, verdict
from webbuild.tools.verify.tokens import MAX_TIE_MARGIN, first_difference, margin_drift, token_summary
from webbuild.tools.verify.visits import FALLBACK_MAX_TOKENS, Clip, Expected, Reference, row

REPO = Path(__file__).resolve().parents[2]
TIE, SURE = MAX_TIE_MARGIN / 4, 5.0  # a near tie, a confident choice


def test_equal_lists_have_no_difference():
    assert first_difference([1, 2, 3], [SURE] * 3, [1, 2, 3], [SURE] * 3) is None
    assert first_difference([], [], [], []) is None


def test_first_difference_is_the_first_position_and_later_ones_do_not_count():
    d = first_difference([1, 2, 7, 9, 9], [SURE, SURE, TIE, SURE, SURE], [1, 2, 8, 3], [SURE, SURE, TIE, TIE])
    assert (d.position, d.browser_token, d.reference_token, d.browser_margin, d.reference_margin) == (2, 7, 8, TIE, TIE)
    assert d.under_margin  # the confident tokens after position 2 follow other contexts: not judged
    assert d.describe() == (f"tokens differ from the Python reference at position 2: browser token 7 (margin "
                            f"{TIE:.4f}), Python token 8 (margin {TIE:.4f})")


@pytest.mark.parametrize("browser_margin, reference_margin, under", [
    (TIE, TIE, True),
    (TIE, SURE, False),  # the reference was sure: the browser's logits are wrong, not noisy
    (SURE, TIE, False),  # the browser was sure of another token
    (MAX_TIE_MARGIN, TIE, False),  # under means strictly under
    (0.0, 0.0, True),  # exact ties both sides
])
def test_a_difference_passes_only_with_both_margins_under_the_bound(browser_margin, reference_margin, under):
    d = first_difference([4, 5], [SURE, browser_margin], [4, 6], [SURE, reference_margin])
    assert d.position == 1 and d.under_margin is under


def test_where_one_side_ended_only_the_other_margin_is_judged():
    ended = first_difference([4], [SURE], [4, 6], [SURE, TIE])  # the browser chose end of sequence at 1
    assert (ended.browser_token, ended.browser_margin, ended.reference_token) == (None, None, 6)
    assert ended.under_margin and "browser ended (margin not recorded)" in ended.describe()
    longer = first_difference([4, 6], [SURE, SURE], [4], [SURE])
    assert (longer.reference_token, longer.reference_margin, longer.under_margin) == (None, None, False)


def test_a_page_without_margins_never_passes_under_the_margin():
    d = first_difference([4, 5], None, [4, 6], [SURE, TIE])
    assert (d.browser_token, d.browser_margin, d.reference_margin) == (5, None, TIE) and not d.under_margin
    assert not first_difference([5], None, [], []).under_margin  # the reference ended: nothing to judge
    assert first_difference([4], None, [4, 6], [SURE, TIE]).under_margin  # the page ended: its margin is moot


def test_margin_drift_is_over_the_agreeing_prefix():
    assert margin_drift([5.0, 3.0, 1.0], [5.01, 2.9, 9.0], upto=2) == pytest.approx(0.1)
    assert margin_drift(None, [1.0], upto=1) is None and margin_drift([1.0], [1.0], upto=0) is None


def test_pick_is_argmax_with_the_gap_to_the_runner_up():
    rng = np.random.default_rng(0)
    for _ in range(50):
        logits = rng.standard_normal(97).astype(np.float32)
        token, margin = pick(logits)
        top = np.sort(logits)[::-1]
        assert token == int(np.argmax(logits)) and margin == float(top[0]) - float(top[1]) > 0
    tie = np.array([0.5, 2.0, -1.0, 2.0], np.float32)
    assert pick(tie) == (1, 0.0)  # the first maximum wins, as numpy's argmax and greedy.js do


def _state(tokens, margins, text, ep="webgpu"):
    """The page's window.webbuild after a transcription: tokens and margins per chunk."""
    return {"text": text, "error": None, "tokens": tokens, "margins": margins, "info": {"ep": ep},
            "metrics": {"total_ms": 1000.0}}


CLIP = Clip("c.wav", "one two")
REF = Expected("one two", [10, 11, 12], [SURE, TIE / 2, SURE])


def test_row_equal_tokens_pass():
    r = row(CLIP, _state([[10, 11], [12]], [[SURE, TIE], [SURE]], "one two"), REF, 0.25, "clips")
    assert r["ok"] and r["difference"] is None and not r["under_margin"] and r["tokens"] == [10, 11, 12]
    assert r["margin_drift"] == pytest.approx(TIE / 2)


def test_row_difference_under_the_margin_passes_and_says_where():
    r = row(CLIP, _state([[10, 13, 14]], [[SURE, TIE, SURE]], "one too"), REF, 0.5, "clips")
    assert r["ok"] and r["under_margin"] and r["reason"] is None
    assert r["difference"]["position"] == 1 and r["difference"]["browser_token"] == 13
    assert r["difference"]["reference_margin"] == TIE / 2


def test_row_confident_difference_fails_with_both_margins():
    r = row(CLIP, _state([[10, 13]], [[SURE, SURE]], "one too"), REF, 0.5, "clips")
    assert not r["ok"] and not r["under_margin"]
    assert r["reason"].startswith(f"tokens differ from the Python reference at position 1: browser token 13 "
                                  f"(margin {SURE:.4f}), Python token 11 (margin {TIE / 2:.4f}); a difference "
                                  f"passes only with its margins under {MAX_TIE_MARGIN}")


def test_row_same_tokens_other_text_fails():
    r = row(CLIP, _state([[10, 11, 12]], [[SURE] * 3], "one twoo"), REF, 0.5, "clips")
    assert not r["ok"] and r["reason"].startswith("same tokens as the Python reference but other text")


def test_row_without_tokens_from_the_page_fails():
    r = row(CLIP, _state(None, None, "one two"), REF, 0.5, "clips")
    assert not r["ok"] and r["reason"] == "the page reported no tokens to compare with the Python reference's"


def test_row_wer_is_judged_before_the_tokens():
    r = row(CLIP, _state([[10, 13]], [[SURE, TIE]], "nothing alike here"), REF, 0.25, "clips")
    assert not r["ok"] and r["reason"].startswith("WER") and r["under_margin"]


def test_a_reference_bounded_in_tokens_is_the_prefix_and_says_it_was_cut(example_dist):
    """The wasm-fallback visit's bound (?max_new_tokens=, FALLBACK_MAX_TOKENS): the reference decodes under it too,
    greedy decoding's first tokens are the unbounded decoding's, and a cut answer is compared by its tokens only."""
    wav = REPO / "examples/tiny-asr/samples/sample-4.wav"
    clip = Clip("sample-4.wav", (REPO / "examples/tiny-asr/samples/sample-4.txt").read_text().strip(), local=wav)
    reference = Reference(example_dist)
    full = reference.transcribe(clip, "fp32")
    assert full is not None and not full.cut and 4 < len(full.tokens) <= FALLBACK_MAX_TOKENS  # a sample fits the bound
    cut = reference.transcribe(clip, "fp32", max_new_tokens=4)
    assert cut is not None and cut.cut and cut.tokens == full.tokens[:4] and cut.margins == full.margins[:4]
    assert reference.transcribe(clip, "fp32", max_new_tokens=len(full.tokens) + 1).cut is False
    page = _state([cut.tokens], [cut.margins], cut.text)
    assert row(clip, page, cut, None, "wasm fallback")["ok"]  # the WER of a cut text is not judged, its tokens are
    assert not row(clip, _state([full.tokens[:3] + [0]], [cut.margins], cut.text), cut, None, "wasm fallback")["ok"]


def _report(rows: list[dict]) -> dict:
    """A verify report around crafted rows, with the fields report.py reads."""
    return {"url": "http://127.0.0.1:1/", "browser": "chromium", "ep": "webgpu", "variant": "fp32", "gpu": "sw",
            "load_ms": {"cold": 1, "warm": 1}, "duration_s": 3.0, "reference": True, "clips_wer": 0.0,
            "reference_equal": sum(r["got"] == r["reference"] for r in rows),
            "ok": all(r["ok"] for r in rows), "checks": [{"name": "console has no errors", "ok": True, "detail": ""}],
            "clips": rows, **token_summary(rows)}


def test_report_counts_clips_passed_under_the_margin(tmp_path):
    same = row(Clip("a.wav", "one two"), _state([[10, 11, 12]], [[SURE] * 3], "one two", "wasm"), REF, 0.5, "clips")
    tie = row(Clip("b.wav", "one two"), _state([[10, 13]], [[SURE, TIE]], "one too"), REF, 0.5, "clips")
    report = _report([same, tie])
    assert (report["tokens_compared"], report["reference_tokens_equal"], report["passed_under_margin"]) == (2, 1, 1)
    assert report["margin_drift"] == {"wasm": pytest.approx(SURE - TIE / 2), "webgpu": 0.0}
    assert verdict(report) == "PASS: 2/2 clips (1 passed under the margin), 1/1 check"
    assert under_margin(report) == [f"MARGIN clip b.wav (clips, webgpu): {tie['difference']['summary']}"]
    lines = table(report).splitlines()
    assert any(line.startswith("b.wav") and " tie@1 " in line for line in lines)
    assert any(line.startswith("a.wav") and "  =  " in line for line in lines)
    assert any("1 passed under the margin" in line for line in lines)
    # JUnit: the count on the clips suite, the difference in the case's system-out, both cases passed
    clips = ET.fromstring(junit(report)).find("testsuite[@name='clips']")
    props = {p.get("name"): p.get("value") for p in clips.find("properties")}
    assert props == {"passed_under_margin": "1", "max_tie_margin": str(MAX_TIE_MARGIN)}
    cases = {c.get("name"): c for c in clips.findall("testcase")}
    assert cases["b.wav [webgpu]"].find("system-out").text.startswith("passed under the margin: tokens differ")
    assert cases["a.wav [wasm]"].find("system-out") is None and clips.get("failures") == "0"
    # the e2e summary, the last lines of `make test`
    (tmp_path / "r.json").write_text(json.dumps(report))
    out = subprocess.run([sys.executable, REPO / "scripts" / "e2e_summary.py", tmp_path / "r.json"], text=True,
                         capture_output=True, check=True, cwd=REPO, env={"PYTHONPATH": str(REPO)}).stdout
    assert out.splitlines()[1:] == [f"{verdict(report)} (full report: {tmp_path / 'r.json'})", *under_margin(report)]


def test_report_without_reference_shows_no_margin_count():
    r = row(CLIP, _state([[10]], [[SURE]], "one two"), None, 0.5, "samples")
    report = _report([r])
    assert report["tokens_compared"] == 0 and verdict(report) == "PASS: 1/1 clip, 1/1 check"
    assert ET.fromstring(junit(report)).find("testsuite[@name='clips']/properties") is None

"""The samples' word error rate in the build's own check: the check stage's transcripts (the Python reference
on the built graphs, webbuild.pipeline.check) against each sample's text in model.yaml. Token agreement with
the source cannot see weights that are wrong in both (random, or another model's); the WER can."""

from __future__ import annotations

import logging

from webbuild.config import Sample
from webbuild.errors import CheckFailed
from webbuild.reference.prompt import parse_answer
from webbuild.reference.wer import wer

log = logging.getLogger(__name__)


def sample_wer(samples: list[Sample], transcripts: dict[str, str]) -> dict[str, dict]:
    """{clip name: {"expected", "transcript", "wer"}} of the samples that were transcribed."""
    out = {}
    for s in samples:
        if s.audio.name in transcripts:
            text = parse_answer(transcripts[s.audio.name])
            out[s.audio.name] = {"expected": s.text, "transcript": text, "wer": round(wer(s.text, text), 4)}
    return out


def report_wer(variant: str, rows: dict[str, dict], max_wer: float, fail: bool) -> None:
    """Each sample's WER on the terminal; above `max_wer` a warning that says what it likely means, or with
    `fail` (verify.build_fails_on_wer, --fail-on-wer) a CheckFailed (exit code 1)."""
    if not rows:
        return
    log.info(f"variant {variant} samples' WER: " + ", ".join(f"{name} {r['wer']:.2f}" for name, r in rows.items()))
    over = {name: r for name, r in rows.items() if r["wer"] > max_wer}
    if not over:
        return
    name, worst = max(over.items(), key=lambda item: item[1]["wer"])
    message = (f"variant {variant}: {len(over)} of {len(rows)} samples above verify.max_wer {max_wer:g} (worst "
               f"{name}: WER {worst['wer']:.2f}, heard {worst['transcript'][:60]!r} for {worst['expected'][:60]!r}): "
               "the site will transcribe badly; the weights may be wrong (random, damaged, or another model's) "
               "or the samples' texts may not match their audio")
    if fail:
        raise CheckFailed(f"{message} (verify.build_fails_on_wer)")
    log.warning(f"{'!' * 8} {message}; --fail-on-wer stops the build instead")

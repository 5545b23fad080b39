"""The live check of `webbuild verify` (and tests/e2e/test_live.py): clips joined with pauses
(webbuild.reference.live) played into the page's Live transcription through Chromium's fake microphone, in real
time; then what the page showed, judged.

- Chromium's fake device resamples the file to its own rate (44.1 kHz) and starts playing it when the page opens
  the microphone, so the page hears a capture of the file, not its samples. The page keeps the frames it
  captured (?keep_audio=1); the Python reference (`webbuild transcribe --live`: the same resampler, LiveChunker
  and greedy decoding) transcribes that capture, and the page's final texts must equal it chunk for chunk, token
  for token (a difference passes only under tools/verify/tokens.py's margin, as every verify comparison).
- The capture's place in the file (capture_offset) maps each clip's known speech end (reference/live.py
  speech_end: the end of its last word) into the page's audio; a sample's capture time follows from the partial
  updates (the device plays in real time). Delays: from a clip's last word's end to the first update showing the
  chunk's final last word in its place (`word_delay_ms`); from the audio that ended a chunk (the policy hears a
  pause `pause_lag_ms` after the speech) to its final text (`pause_to_final_ms`); the page's own metrics
  (runtime/live.js summary) beside them.
- Finals never change: every poll of the page's finals extends the one before, and no chunk has a partial after
  its final.
"""

from __future__ import annotations

import base64
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from webbuild.reference.audio import read_wav, write_float_wav, write_wav
from webbuild.reference.live import Span, capture_offset, join_with_pauses
from webbuild.site.contract import KEEP_AUDIO, LIVE_BUTTON
from webbuild.tools import browser as br

log = logging.getLogger(__name__)
SR = 16000
TAIL_SECONDS = 2.0  # listened to after the file ends: its last pause is heard, then Stop


def fake_microphone(wav: Path) -> list[str]:
    """Chromium's flags that make `wav` the microphone (played once: %noloop) and grant it without a prompt."""
    return ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={wav}%noloop"]


@dataclass
class LiveRun:
    """What the page showed: its live state (app.js LiveState), the audio it captured (mono, at `rate`), and
    whether every poll's finals extended the previous poll's."""

    state: dict
    variant: str | None
    captured: np.ndarray
    rate: int
    finals_kept: bool
    polls: int
    error: str | None = None


def make_audio(clips: list[Path], folder: Path) -> tuple[Path, np.ndarray, list[Span]]:
    """The clips joined with pauses as a 16 kHz WAV in `folder`: (path, its samples, the clips' spans)."""
    pcm, spans = join_with_pauses([read_wav(p) for p in clips])
    path = folder / "live.wav"
    write_wav(path, pcm)
    return path, read_wav(path), spans  # as written (16-bit)


def drive(playwright, choice, url: str, wav: Path, seconds: float, timeout_s: float, page_log: dict | None = None,
          language: str | None = None) -> LiveRun:
    """Opens `url` (its query keeps the audio) with `wav` as the microphone, presses Live transcription (with
    `language` chosen in the page's picker first, where given), listens for `seconds` + TAIL_SECONDS while polling
    the finals, presses it again and waits for the last final."""
    sep = "&" if "?" in url else "?"
    browser = br.launch(playwright, choice, extra=fake_microphone(wav))
    try:
        page = browser.new_context(permissions=["microphone"]).new_page()
        br.watch(page, page_log)
        br.open_page(page, f"{url}{sep}{KEEP_AUDIO}=1", timeout_s)
        if (error := page.evaluate("() => window.webbuild.error")) is not None:
            return LiveRun({}, None, np.zeros(0, np.float32), SR, False, 0, error)
        if language is not None:
            page.select_option("#language", language)
        page.click(f"#{LIVE_BUTTON}")
        br.wait_for(page, "() => window.webbuild.live?.status === 'listening' || window.webbuild.error", 30)
        kept, polls, shown = True, 0, list[str]()
        end = time.monotonic() + seconds + TAIL_SECONDS
        while time.monotonic() < end:
            finals = page.evaluate("() => window.webbuild.live?.finals ?? []")
            kept &= finals[:len(shown)] == shown
            shown, polls = finals, polls + 1
            time.sleep(0.2)
        page.click(f"#{LIVE_BUTTON}")
        br.wait_for(page, "() => window.webbuild.live?.status === 'done' || window.webbuild.error", timeout_s)
        state = page.evaluate("() => window.webbuild")
        kept &= state["live"]["finals"][:len(shown)] == shown
        audio = np.frombuffer(base64.b64decode(page.evaluate("() => window.webbuildLiveAudio()")), np.float32)
        return LiveRun(state["live"], state["info"]["variant"], audio, int(state["live"]["rate"]), kept, polls,
                       state["error"])
    finally:
        browser.close()


def capture_wav(run: LiveRun, folder: Path) -> Path:
    """The page's capture as a float32 WAV at its rate: what `webbuild transcribe --live` reads."""
    path = folder / "captured.wav"
    write_float_wav(path, run.captured, run.rate)
    return path


def words(text: str) -> list[str]:
    return text.split()


def clip_delays(run: LiveRun, played: np.ndarray, spans: list[Span], captured16k: np.ndarray) -> list[dict]:
    """Per clip: where its speech ends in the page's audio, the chunk holding it, whether a partial text of its
    speech (any of its chunks) was shown before the clip ended, and the delay from its last word's end to that word's
    first appearance."""
    offset = capture_offset(captured16k, played)
    updates = run.state["updates"]
    partials = [u for u in updates if not u["final"]] or updates
    clock = float(np.median([u["audioAt"] - 1000 * u["end"] / SR for u in partials]))  # wall ms of sample 0
    at = lambda n: clock + 1000 * n / SR  # noqa: E731 - when the page captured its sample n
    finals = {u["chunk"]: u for u in updates if u["final"]}
    out = []
    for k, span in enumerate(spans):
        spoken, ended = span.speech_end - offset, span.end - offset
        chunk = next((c for c, u in finals.items() if u["start"] < spoken <= u["end"]), None)
        row = {"clip": k, "speech_end": spoken, "chunk": chunk, "partial_before_end": False, "word_delay_ms": None}
        # the chunks of the clip's speech: a clip with pauses inside (words apart) is cut into several, and its
        # last may be too short for a partial of its own; a partial of any of them shows text while it is spoken
        spoken_in = {c for c, u in finals.items() if u["end"] > span.start - offset and u["start"] < spoken}
        row["partial_before_end"] = any(not u["final"] and u["text"] and u["shownAt"] < at(ended)
                                        for u in updates if u["chunk"] in spoken_in)
        if chunk is not None:
            mine = [u for u in updates if u["chunk"] == chunk]
            last = words(finals[chunk]["text"])
            first = next((u for u in mine if len(words(u["text"])) >= len(last) and last
                          and words(u["text"])[len(last) - 1] == last[-1]), None)
            if first is not None:
                row["word_delay_ms"] = round(first["shownAt"] - at(spoken), 1)
        out.append(row)
    return out


def finals_once(state: dict) -> bool:
    """No chunk has a partial after its final, nor two finals."""
    seen: set[int] = set()
    for u in state["updates"]:
        if u["chunk"] in seen:
            return False
        if u["final"]:
            seen.add(u["chunk"])
    return True


def summary(values: list[float]) -> dict | None:
    return {"n": len(values), "mean": round(float(np.mean(values)), 1), "median": round(float(np.median(values)), 1),
            "max": round(float(np.max(values)), 1)} if values else None


def measure(playwright, choice, url: str, clips: list[Path], timeout_s: float, page_log: dict | None = None,
            reference=None) -> dict:
    """The live check's measurements (the module's docstring): per clip, the page's metrics, and with a
    `reference` (variant -> a Transcriber of the site, or None) its chunks and tokens on the page's capture."""
    with tempfile.TemporaryDirectory(prefix="webbuild-live-") as tmp:
        wav, played, spans = make_audio(clips, Path(tmp))
        run = drive(playwright, choice, url, wav, len(played) / SR, timeout_s, page_log)
        if run.error is not None or not run.state:
            return {"error": run.error or "the page has no live state"}
        captured = capture_wav(run, Path(tmp))
        rows = clip_delays(run, played, spans, read_wav(captured))
        transcriber = reference(run.variant) if reference is not None else None
        ref = transcriber.decode_live(captured) if transcriber is not None else None
    finals = [u for u in run.state["updates"] if u["final"]]
    delays = [r["word_delay_ms"] for r in rows if r["word_delay_ms"] is not None]
    return {
        "clips": rows, "metrics": run.state["metrics"], "rate": run.rate, "polls": run.polls,
        "finals_kept": run.finals_kept and finals_once(run.state),
        "page": {"chunks": [[u["start"], u["end"]] for u in finals], "tokens": [u["tokens"] for u in finals],
                 "margins": [u["margins"] for u in finals], "text": run.state["finals"]},
        "reference": None if ref is None else {"chunks": [[c.start, c.end] for c in ref],
                                               "tokens": [c.decoded.tokens for c in ref],
                                               "margins": [c.decoded.margins for c in ref]},
        "word_delay_ms": summary(delays),
        "pause_to_final_ms": (run.state["metrics"] or {}).get("pause_to_final_ms"),
    }


def judge(result: dict) -> list[tuple[str, bool, str]]:
    """The live check's verdicts: (name, ok, one-line detail), the delays in the detail."""
    if "error" in result:
        return [("live: the page transcribes from the microphone", False, result["error"])]
    page, ref, rows, m = result["page"], result["reference"], result["clips"], result["metrics"]
    late = [r["clip"] for r in rows if not r["partial_before_end"]]
    out = [("live: the page transcribes from the microphone", bool(page["chunks"]),
            f"{len(page['chunks'])} chunks of {m['audio_ms'] / 1000:.1f} s at {result['rate']} Hz"),
           ("live: partial text shown before each clip ends", not late,
            f"{len(rows) - len(late)}/{len(rows)} clips" + (f"; not clip {late}" if late else "")),
           ("live: final texts never change", result["finals_kept"], f"{result['polls']} polls of the page")]
    if ref is not None:
        differ = [i for i, (a, b) in enumerate(zip(page["tokens"], ref["tokens"])) if a != b]
        same_cuts = page["chunks"] == ref["chunks"]
        out.append(("live: final texts equal the Python reference's (transcribe --live on the page's capture)",
                    same_cuts and not differ, f"cuts {'equal' if same_cuts else 'differ'}; tokens differ in chunks "
                                              f"{differ}" if differ or not same_cuts else
                    f"{len(page['chunks'])} chunks, token for token"))
    fmt = lambda s: "n/a" if not s else f"mean {s['mean']:.0f} ms, max {s['max']:.0f} ms"  # noqa: E731
    out.append(("live: delays measured", result["word_delay_ms"] is not None,
                f"word end to first shown {fmt(result['word_delay_ms'])}; pause to final text "
                f"{fmt(result['pause_to_final_ms'])} (+{m['pause_lag_ms']:.0f} ms to hear the pause); partial lag "
                f"{fmt(m['partial_lag_ms'])}; update every {m['interval_ms']:.0f} ms; RTF {m['rtf']:.3f}"))
    return out

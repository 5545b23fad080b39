"""The first clip of each length on a loaded site: how long it takes and which WebGPU compute pipelines
onnxruntime-web compiles for it (each a shader compile the visitor waits for). Driven through Playwright's
handle on the bench copy's worker (instrument.py counted_site: counters.mjs counts every pipeline made,
synth_hook.js `__wbFirstUse` transcribes one chunk). Used by rounds.py's first-use step (`webbuild bench --first-use`)
and tests/test_first_use.py.

Clips: the site's sample clips (speech) one after another with a quarter second between them, cut or
padded with silence to the exact length, so that the decoder has words to decode at every length."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np

from webbuild.reference.audio import read_wav

RATE = 16000
GAP_S = 0.25
FIRST_USE_SECONDS = (1.0, 2.5, 5.0, 8.0, 15.0, 30.0)  # issue 31's first clips


def speech(dist: Path, samples: list[dict]) -> list[np.ndarray]:
    """The site's sample clips (samples.json entries, `src` relative to dist) as 16 kHz float32 PCM."""
    return [read_wav(dist / s["src"]) for s in samples]


def clip_of(seconds: float, clips: list[np.ndarray]) -> np.ndarray:
    """`seconds` of audio: the clips in turn (repeated as needed) with GAP_S of silence between, cut at the end."""
    n = round(seconds * RATE)
    out = np.zeros(n, np.float32)
    at, i = 0, 0
    while at < n and clips:
        part = clips[i % len(clips)][: n - at]
        out[at:at + len(part)] = part
        at += len(part) + round(GAP_S * RATE)
        i += 1
    return out


def first_use(worker, pcm: np.ndarray, max_new_tokens: int | None = None) -> dict:
    """One transcription of `pcm` in the site's worker: {text, tokens, timings, encoder_pipelines,
    decoder_pipelines} (the pipelines' names, the ones made during it)."""
    b64 = base64.b64encode(np.ascontiguousarray(pcm, np.float32).tobytes()).decode()
    return worker.evaluate("([b, n]) => self.__wbFirstUse(b, n)", [b64, max_new_tokens])


def row(seconds: float, r: dict) -> dict:
    """A first-use result as the bench reports it, timings in ms rounded."""
    t = r["timings"]
    return {"seconds": seconds, "text": r["text"], "tokens": r["tokens"],
            **{k: round(t[k], 1) for k in ("encoder_ms", "prefill_ms", "ttft_ms", "total_ms")},
            "prompt_tokens": t["prompt_tokens"],
            "new_pipelines": len(r["encoder_pipelines"]) + len(r["decoder_pipelines"]),
            "encoder_pipelines": r["encoder_pipelines"], "decoder_pipelines": r["decoder_pipelines"]}


def sweep(worker, lengths, clips: list[np.ndarray], max_new_tokens: int | None = None) -> list[dict]:
    """The lengths in turn on one loaded page: row() of each (new pipelines: the ones not made before it)."""
    return [row(s, first_use(worker, clip_of(s, clips), max_new_tokens)) for s in lengths]

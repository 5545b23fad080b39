"""What speech detection costs and gives on a built site (BENCHMARKS.md "Speech detection"): per clip, the Python
reference's VAD time (ms per second of audio, onnxruntime CPU) and the page's (Chromium, wasm EP: the worker's
metrics.vad_ms), with each one's text; the clips are the site's samples joined with 1 s of quiet, 60 s of white
noise, 30 s of silence (zeros, low noise) and 30 s of music-like tones (tests/vad_audio.py), each transcribed twice.

    .venv/bin/python scripts/vad_latency.py dist [--skip-page]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: its tests/vad_audio.py makes the clips


def clips(site: Path, folder: Path) -> dict[str, Path]:
    from tests.vad_audio import silence, tones, white_noise
    from webbuild.reference.audio import read_wav, write_wav

    quiet = np.zeros(16000, np.float32)
    samples = [read_wav(p) for p in sorted((site / "samples").glob("*.wav"))]
    made = {"samples": np.concatenate([part for s in samples for part in (s, quiet)]), "noise-60s": white_noise(60),
            "zeros-30s": silence(30), "low-noise-30s": silence(30, 0.003), "tones-30s": tones(30)}
    for name, pcm in made.items():
        write_wav(folder / f"{name}.wav", pcm)
    return {name: folder / f"{name}.wav" for name in made}


def reference_rows(site: Path, paths: dict[str, Path]) -> list[dict]:
    from webbuild.reference.audio import stream_wav
    from webbuild.reference.transcribe import load_transcriber

    t = load_transcriber(site)
    assert t.vad is not None, f"{site} was built with speech_detection: false"
    rows = []
    for name, path in [*paths.items(), *paths.items()]:
        t0 = time.perf_counter()
        _, samples = t.vad.probabilities(stream_wav(path))
        vad_ms = (time.perf_counter() - t0) * 1000
        t0 = time.perf_counter()
        text = t.file_text(t.decode_file(path))
        rows.append({"where": "cli", "clip": name, "audio_s": samples / 16000, "vad_ms": round(vad_ms, 1),
                     "vad_ms_per_s": round(vad_ms / (samples / 16000), 1),
                     "transcribe_ms": round((time.perf_counter() - t0) * 1000), "text": text})
    return rows


def page_rows(site: Path, paths: dict[str, Path]) -> list[dict]:
    from playwright.sync_api import sync_playwright

    from webbuild.tools.browser import open_site, wait_for
    from webbuild.tools.serve import start

    done = "() => window.webbuild.status === 'done' || window.webbuild.error"
    srv, rows = start(site, quiet=True), []
    try:
        with sync_playwright() as pw:
            browser, page, _ = open_site(pw, srv, "", webgpu=False)  # the CPU path: wasm
            for name, path in [*paths.items(), *paths.items()]:
                page.set_input_files("#file", str(path))
                wait_for(page, done, 900)
                state = page.evaluate("() => window.webbuild")
                m = state["metrics"]
                rows.append({"where": "page", "clip": name, "audio_s": m["audio_ms"] / 1000,
                             "vad_ms": round(m["vad_ms"]),
                             "vad_ms_per_s": round(m["vad_ms"] / (m["audio_ms"] / 1000), 1),
                             "transcribe_ms": round(m["total_ms"]), "text": " ".join(state["texts"])})
            browser.close()
    finally:
        srv.shutdown()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("site", type=Path, help="a built site (dist/) with speech detection")
    ap.add_argument("--skip-page", action="store_true", help="the Python reference only (no Chromium)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="vad-latency-") as tmp:
        paths = clips(args.site, Path(tmp))
        rows = reference_rows(args.site, paths) + ([] if args.skip_page else page_rows(args.site, paths))
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()

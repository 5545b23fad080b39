"""A long recording through `webbuild transcribe SITE` and through the site's page: the figures of
BENCHMARKS.md "Long recordings".

    python scripts/long_audio.py --clips 165 --out /tmp/long     # 165 held-out clips, ~10 min, joined
    python scripts/long_audio.py --site dist --out /tmp/long --page   # + the page on wasm, token for token

Writes OUT/long.wav (+ .txt) and OUT/clips/ with webbuild.train.clips (once), builds the example into
OUT/dist unless --site is given, then runs `webbuild transcribe SITE long.wav --json` and the same on the clips
one by one, and prints the wall time, peak RSS, WER of each and chunk count; with --page also the page's
transcription of long.wav on the wasm EP in Chromium and whether its tokens equal the Python reference's, chunk
for chunk. Prints one JSON object at the end.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

# runs argv[1:] and prints its peak RSS last on stderr: the command's own, not an earlier command's of this script
MEASURE = ("import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:]).returncode; "
           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, file=sys.stderr); sys.exit(rc)")


def run(*args: str) -> tuple[subprocess.CompletedProcess, float, int]:
    """The command, its wall seconds and its peak RSS in bytes."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", MEASURE, *args], capture_output=True, text=True, check=False)
    if proc.returncode:
        sys.exit(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc, time.monotonic() - t0, int(proc.stderr.split()[-1])


def page_tokens(site: Path, wav: Path) -> list[list[int]]:
    from playwright.sync_api import sync_playwright

    from webbuild.tools.browser import open_site, wait_for
    from webbuild.tools.serve import start

    srv = start(site, quiet=True)
    with sync_playwright() as pw:
        browser, page, _ = open_site(pw, srv, "?ep=wasm", webgpu=False)
        try:
            page.set_input_files("#file", str(wav))
            wait_for(page, "() => window.webbuild.status === 'done' || window.webbuild.error", 3600)
            state = page.evaluate("() => window.webbuild")
        finally:
            browser.close()
            srv.shutdown()
    if state["error"]:
        sys.exit(f"the page failed: {state['error']}")
    return state["tokens"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="working folder")
    ap.add_argument("--clips", type=int, default=165, help="held-out clips joined into long.wav")
    ap.add_argument("--site", type=Path, help="a built site (default: the example, built into OUT/dist)")
    ap.add_argument("--page", action="store_true", help="also transcribe long.wav in the page (wasm) and compare")
    args = ap.parse_args()
    out, exe = args.out, [sys.executable, "-m", "webbuild"]
    wav = out / "long.wav"
    if not wav.is_file():
        run(sys.executable, "-m", "webbuild.train.clips", str(out / "clips"), "--count", str(args.clips),
            "--joined", str(wav))
    site = args.site or out / "dist"
    if not (site / "index.html").is_file():
        run(*exe, "examples/tiny-asr/model.yaml", "-o", str(site))
    long, long_s, long_rss = run(*exe, "transcribe", str(site), str(wav), "--json")
    one, one_s, _ = run(*exe, "transcribe", str(site), str(out / "clips"), "--json")
    rows = [json.loads(line) for line in one.stdout.splitlines()]
    from webbuild.reference.wer import corpus_wer

    result = {"audio_s": round((wav.stat().st_size - 44) / 2 / 16000, 1), "wall_s": round(long_s, 1),
              "peak_rss_bytes": long_rss,
              "wer": json.loads(long.stdout)["wer"], "clips": len(rows),
              "wer_one_by_one": round(corpus_wer([(r["expected"], r["text"]) for r in rows]), 4),
              "one_by_one_wall_s": round(one_s, 1)}
    if args.page:
        from webbuild.reference.transcribe import load_transcriber

        chunks = load_transcriber(site).decode_file(wav)
        t0 = time.monotonic()
        tokens = page_tokens(site, wav)
        result |= {"chunks": len(chunks), "page_wall_s": round(time.monotonic() - t0, 1),
                   "page_chunks": len(tokens), "page_tokens_equal": tokens == [c.tokens for c in chunks]}
    print(json.dumps(result))


if __name__ == "__main__":
    main()

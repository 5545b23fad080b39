"""`webbuild bench DIR --runtime browser`: the built site's own page and worker in Chromium
(Playwright), served on loopback; the button of each sample of the site's samples.json is clicked and
window.webbuild's metrics read back. The page exposes per-transcription rates, not per-token times,
so decode ms/token is spread over clips (1000 / decode tokens/s of each), and there is no synthetic
decode."""

from __future__ import annotations

import platform
from pathlib import Path

from webbuild.errors import BenchError
from webbuild.tools import browser as br
from webbuild.tools.verify.runner import Clip, site_data, site_url, transcribe


def run_browser(dist: Path, ep: str = "auto", repeat: int = 1, max_clips: int | None = None,
                timeout_s: float = 900) -> dict:
    from playwright.sync_api import sync_playwright

    choice = br.choose()
    with site_url(str(dist)) as (url, _), sync_playwright() as pw:
        browser = br.launch(pw, choice, webgpu=ep != "wasm")
        try:
            page = browser.new_page()
            br.open_page(page, url + (f"?ep={ep}" if ep != "auto" else ""), timeout_s)
            state = page.evaluate("() => window.webbuild")
            if state["status"] == "error":
                raise BenchError(f"the site failed to load: {state['error']}")
            samples = site_data(page.context, url)["samples"][:max_clips]
            clips = [clip_row(transcribe(page, Clip(s["id"], s["text"], button=s["id"]), timeout_s), s["text"])
                     for s in samples for _ in range(repeat)]
        finally:
            browser.close()
    return report(state["info"], clips, choice.describe())


def spread(xs: list[float]) -> dict:
    """median / p10 / p90 with linear interpolation, as webbuild/tools/bench/stats.mjs computes them."""
    s = sorted(xs)

    def q(p: float):
        if not s:
            return None
        at = (len(s) - 1) * p
        lo = int(at)
        return s[lo] + (at - lo) * (s[min(lo + 1, len(s) - 1)] - s[lo])

    return {"median": q(0.5), "p10": q(0.1), "p90": q(0.9), "n": len(s)}


def clip_row(state: dict, expected: str) -> dict:
    m = state.get("metrics") or {}
    rate = m.get("decode_tokens_per_s")
    return {"expected": expected, "text": state["text"], "match": state["text"] == expected, "error": state["error"],
            "tokens": m.get("generated_tokens"), "encoder_ms": m.get("encoder_ms"), "ttft_ms": m.get("ttft_ms"),
            "prompt_tokens": m.get("prompt_tokens"), "prefill_tokens_per_s": m.get("prefill_tokens_per_s"),
            "decode_ms_per_token": 1000 / rate if rate else None, "audio_ms": m.get("audio_ms"),
            "total_ms": m.get("total_ms")}


def report(info: dict, clips: list[dict], browser: str) -> dict:
    def med(k):
        return spread([c[k] for c in clips if c[k] is not None])["median"]

    prefill = med("prefill_tokens_per_s")
    return {
        "bench": "webbuild-browser", "browser": browser, "host": platform.node(), "ep": info["ep"],
        "variant": info["variant"], "threads": info.get("threads"), "kv_cache": info.get("kvCache"),
        "adapter": info.get("adapter"), "shader_f16": info.get("shaderF16", False),
        "model_bytes": info.get("modelBytes"), "load": info["load"], "clips": clips,
        "summary": {"clips": len(clips), "clips_matching": sum(c["match"] for c in clips),
                    "encoder_ms": med("encoder_ms"), "ttft_ms": med("ttft_ms"), "prompt_tokens": med("prompt_tokens"),
                    "prefill_tokens_per_s": prefill,
                    "prefill_ms": med("prompt_tokens") / prefill * 1000 if prefill else None,
                    "decode_ms_per_token_clips": spread([c["decode_ms_per_token"] for c in clips
                                                         if c["decode_ms_per_token"]])},
        "synthetic_decode": None,
    }

"""`webbuild bench DIR --runtime browser`: the built site's own page and worker in Chromium
(Playwright), served on loopback; the button of each sample of the site's samples.json is clicked and
window.webbuild's metrics read back. The page exposes per-transcription rates, not per-token times,
so the clips' decode ms/token is spread over clips (1000 / decode tokens/s of each).

The page is served from a temporary bench-only copy of the site (counted_site: hard links, worker.js
with the WebGPU call counters in front and a synthetic-decode hook behind; the built site is not
touched). Through Playwright's handle on the site's worker, the hook then runs bench.mjs's synthetic
decode with counters.mjs's gpuCountedDecodes, as the Node bench does: `synthetic_decode` (ms/token of
the long decode's steps) and `counters_per_token` (null on the wasm EP). With an adapter, the page's own picker
switches it on first, so the clips and the decode run the adapted sessions."""

from __future__ import annotations

import logging
import os
import platform
import tempfile
import time
from pathlib import Path

from webbuild.errors import BenchError, require_extra
from webbuild.tools import browser as br
from webbuild.tools.bench import require_adapter, wasm_estimate
from webbuild.tools.bench.instrument import counted_site, counted_site_parent
from webbuild.tools.verify.visits import Clip, site_data, site_url, switch_lora, transcribe

log = logging.getLogger(__name__)


def run_browser(dist: Path, ep: str = "auto", repeat: int = 1, max_clips: int | None = None,
                decode_tokens: int = 128, timeout_s: float = 900, adapter: str | None = None,
                threads: int | None = None, max_new_tokens: int | None = None, warm_up: str = "shapes") -> dict:
    """adapter: the site's LoRA adapter picked in the page before the clips and the synthetic decode; threads: the
    wasm EP's (the page's ?threads=; None: the page's own rule); max_new_tokens: each clip's decode capped (the
    page's ?max_new_tokens=), for models slow on an EP; warm_up (WARM_UPS): the page's ?warm=shapes, ?warm=decode
    (the longest chunk left out), or none (a second of silence on a software GPU). The server sends the site's
    _headers, COOP/COEP among them: the page is cross-origin isolated, and the threads asked for run."""
    require_extra("verify", "webbuild bench --runtime browser", "playwright")  # not in `make site`'s install
    from playwright.sync_api import sync_playwright

    if not (dist / "worker.js").is_file() or not (dist / "index.html").is_file():
        raise BenchError(f"{dist}: not a built site (no index.html and worker.js); "
                         f"build it with `webbuild model.yaml -o {dist}`")
    choice = br.choose()
    with tempfile.TemporaryDirectory(prefix=".webbuild-bench-", dir=counted_site_parent(dist)) as tmp:
        copy = counted_site(dist, Path(tmp) / "site")
        with site_url(str(copy)) as (url, _), sync_playwright() as pw:
            browser = br.launch(pw, choice, webgpu=ep != "wasm")
            try:
                page = browser.new_page()
                log.info(f"loading the page in {choice.describe()}")
                # every shape class warmed, on a software GPU too (as the Node bench's warmShapes): the counts per
                # token are then the steady decode's, on the prefill runs a hardware GPU's warm-up chooses
                params = {"warm": warm_up if warm_up != "second" else None, "ep": ep if ep != "auto" else None,
                          "threads": threads, "max_new_tokens": max_new_tokens}
                br.open_page(page, url + "?" + "&".join(f"{k}={v}" for k, v in params.items() if v), timeout_s)
                state = page.evaluate("() => window.webbuild")
                if state["status"] == "error":
                    raise BenchError(f"the site failed to load: {state['error']}")
                if adapter:
                    pick_adapter(page, state["info"], adapter, timeout_s)
                samples = site_data(page.context, url)["samples"][:max_clips]
                clips = []
                for s in [s for s in samples for _ in range(repeat)]:
                    clips.append(clip_row(transcribe(page, Clip(s["id"], s["text"], button=s["id"]), timeout_s),
                                          s["text"]))
                    log.info(f"clip {len(clips)} of {len(samples) * repeat}: {s['id']}: {clips[-1]['text']!r}")
                log.info(f"synthetic decode: {decode_tokens} tokens in the site's worker")
                worker = site_worker(page)
                synth = counted_decodes(worker, decode_tokens)
                memory = {"wasm_heap_bytes": {"loaded": state["info"].get("wasmHeapBytes"),
                                              "peak": worker.evaluate("() => self.__wbHeap()")},
                          "tab_rss_bytes": renderer_memory()["tab_rss_bytes"],
                          "tab_rss_after_gc_bytes": rss_after_gc(page, worker)}
                memory["tab_peak_rss_bytes"] = renderer_memory()["tab_peak_rss_bytes"]  # a collection's included
            finally:
                browser.close()
    memory["wasm_estimate_bytes"] = wasm_estimate(dist, state["info"]["variant"])
    memory["tab_estimate_bytes"] = wasm_estimate(dist, state["info"]["variant"], "tab_bytes")
    return {**report(state["info"], clips, choice.describe(), synth), **memory, "lora": adapter}


def renderer_memory() -> dict:
    """The tab's resident memory: the largest Chromium renderer started from this process (it runs the page and
    its workers; the GPU and browser processes are not the tab's), its peak (VmHWM) and now (VmRSS); None where
    /proc does not say (not Linux)."""
    renderers = [pid for pid, cmd in _descendants(os.getpid()) if "--type=renderer" in cmd]

    def largest(field: str) -> int | None:
        return max((n for pid in renderers if (n := _status_bytes(pid, field)) is not None), default=None)

    return {"tab_peak_rss_bytes": largest("VmHWM"), "tab_rss_bytes": largest("VmRSS")}


def rss_after_gc(page, worker) -> int | None:
    """The tab's resident memory after full collections in the worker and the page, where the browser exposes
    gc() (WEBBUILD_BROWSER_ARGS=--js-flags=--expose-gc): what of the tab is garbage V8 had not yet collected.
    None where it does not."""
    if not worker.evaluate("() => typeof gc === 'function'"):
        return None
    for _ in range(2):
        worker.evaluate("() => { gc(); }")
        page.evaluate("() => { gc(); }")
        time.sleep(1)  # the freed pages leave the process's resident set
    return renderer_memory()["tab_rss_bytes"]


def _descendants(root: int) -> list[tuple[int, str]]:
    """(pid, command line) of every process below `root`, read from /proc."""
    parent, cmd = {}, {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or not readable
    below, todo = [], [root]
    while todo:
        up = todo.pop()
        kids = [p for p, pp in parent.items() if pp == up]
        below += kids
        todo += kids
    return [(p, cmd.get(p, "")) for p in below]


def _status_bytes(pid: int, field: str) -> int | None:
    try:
        line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith(f"{field}:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) * 1024


def pick_adapter(page, info: dict, name: str, timeout_s: float) -> None:
    """The page's picker set to adapter `name`, the switch waited for; a clear error for a site without it."""
    require_adapter(info.get("loraAdapters") or [], name)
    log.info(f"adapter {name} on")
    if error := switch_lora(page, name, timeout_s):
        raise BenchError(f"switching to adapter {name!r} failed: {error}")


def site_worker(page, timeout_s: float = 10):
    """Playwright's handle on the site's worker, checked to be the instrumented one."""
    deadline = time.monotonic() + timeout_s
    while not page.workers and time.monotonic() < deadline:
        time.sleep(0.1)
    worker = next((w for w in page.workers if w.url.split("?")[0].endswith("/worker.js")), None)
    if worker is None or worker.evaluate("() => typeof self.__wbCountedSynth") != "function":
        raise BenchError("the site's worker has no synthetic-decode hook (not the bench copy's worker.js?)")
    return worker


def counted_decodes(worker, decode_tokens: int) -> dict:
    """bench.mjs's synthetic decode and counters in the worker: {result, counters_per_token}."""
    return worker.evaluate("n => self.__wbCountedSynth(n)", decode_tokens)


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
            "total_ms": m.get("total_ms"), "lora": state.get("doneLora")}


def report(info: dict, clips: list[dict], browser: str, synth: dict | None = None) -> dict:
    def med(k):
        return spread([c[k] for c in clips if c[k] is not None])["median"]

    prefill = med("prefill_tokens_per_s")
    return {
        "bench": "webbuild-browser", "browser": browser, "host": platform.node(), "ep": info["ep"],
        "variant": info["variant"], "threads": info.get("threads"), "threads_why": info.get("threadsWhy"),
        "kv_cache": info.get("kvCache"),
        "decode": info.get("decode"),
        "gpu": info.get("gpu"), "shader_f16": info.get("shaderF16", False),
        "model_bytes": info.get("modelBytes"), "load": info["load"], "clips": clips,
        "summary": {"clips": len(clips), "clips_matching": sum(c["match"] for c in clips),
                    "encoder_ms": med("encoder_ms"), "ttft_ms": med("ttft_ms"), "prompt_tokens": med("prompt_tokens"),
                    "prefill_tokens_per_s": prefill,
                    "prefill_ms": med("prompt_tokens") / prefill * 1000 if prefill else None,
                    "decode_ms_per_token_clips": spread([c["decode_ms_per_token"] for c in clips
                                                         if c["decode_ms_per_token"]])},
        "synthetic_decode": synthetic(synth["result"]) if synth else None,
        "counters_per_token": synth["counters_per_token"] if synth else None,
    }


def synthetic(r: dict) -> dict:
    """The long synthetic decode as bench.mjs reports it."""
    return {"prompt_tokens": r["prompt_tokens"], "prefill_ms": r["prefill_ms"], "tokens": len(r["steps"]),
            "ms_per_token": spread(r["steps"])}

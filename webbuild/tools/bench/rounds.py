"""`webbuild bench DIST --rounds N`: the built site's page in Chromium beside a merged-decoder peer page and
`webbuild bench` under Node + Dawn, rows alternated in rounds (A B C, A B C, ...), with the WebGPU calls per
decode token and the GPU's clock over every round. The browser is webbuild's own choice (WEBBUILD_BROWSER,
WEBBUILD_BROWSER_ARGS), launched through Playwright; on the GPU machine scripts/chrome_gpu_bench.sh runs it
(docs/gpu-machine.md).

Rows (`--row`, repeatable):
  chromium-webbuild  the built site's own page and worker, from the bench copy (instrument.py counted_site:
                     counters in front of worker.js, synth_hook.js behind): the site's Recogniser decodes n
                     greedy steps past any end token after silence, as bench.mjs does under Node
  chromium-webbuild:QUERY  the same page with QUERY added to its address (a page of its own), e.g.
                     chromium-webbuild:decode=plain: a decode form forced against the page's own choice
  chromium-webbuild-lora  with --adapter NAME: the site's page with its picker on NAME, just before the
                     chromium-webbuild row, which picks it off again (adapter on and off alternated on one page)
  chromium-peer      a merged decoder (onnxruntime-genai's model.onnx, --peer) on merged_page.html, merged.mjs
                     ported to a page
  node-webbuild, node-peer  `webbuild bench DIST|PEER --ep webgpu` under Node + Dawn, counted by its own report
Per decode token counts = (counts of an n2-step decode - counts of an n1-step decode) / (n2 - n1). The Chromium
pages load once (a fresh profile each: no decode form kept from another page); every round runs n1 and n2 steps.
A page's WebGPU adapter must be the GPU (a fallback or SwiftShader adapter stops the run) unless
--allow-software. After the rounds: --step-trace (captured steps timed one by one), --timing (a decode of each
Chromium page cut into phases and GPU kernel times), --first-use (a fresh page per clip length: its load and its
first clip's TTFT and new pipelines; first_use.py).
"""

from __future__ import annotations

import functools
import http.server
import json
import logging
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from webbuild.errors import BenchError
from webbuild.site.ort_files import ORT_FILES_DIR
from webbuild.tools import browser as br
from webbuild.tools.bench import HARNESSES, gpu_clock
from webbuild.tools.bench import first_use as fu
from webbuild.tools.bench.instrument import counted_site
from webbuild.tools.bench.page_bench import pick_adapter, site_worker, spread
from webbuild.tools.verify.visits import Clip, site_url, switch_lora, transcribe

log = logging.getLogger(__name__)

ADAPTER_JS = """async () => {
  if (!navigator.gpu) return { error: 'no navigator.gpu' };
  const a = await navigator.gpu.requestAdapter({ powerPreference: 'high-performance' });
  if (!a) return { error: 'requestAdapter() returned null' };
  const i = a.info ?? {};
  return { vendor: i.vendor, architecture: i.architecture, device: i.device, description: i.description,
    isFallbackAdapter: i.isFallbackAdapter ?? a.isFallbackAdapter ?? null, subgroupMinSize: i.subgroupMinSize,
    subgroupMaxSize: i.subgroupMaxSize, features: [...a.features].sort(),
    limits: { maxBufferSize: a.limits.maxBufferSize, maxStorageBufferBindingSize: a.limits.maxStorageBufferBindingSize,
              maxComputeWorkgroupStorageSize: a.limits.maxComputeWorkgroupStorageSize } };
}"""

PEER_PAGE = Path(__file__).resolve().with_name("merged_page.html")
COUNT_KEYS = ("dispatches", "indirect", "submits", "readbacks", "write_buffers", "write_bytes", "bind_groups",
              "buffers")
SITE_ROW, PEER_ROW, LORA_ROW = "chromium-webbuild", "chromium-peer", "chromium-webbuild-lora"
NODE_ROWS = ("node-webbuild", "node-peer")
STEP_TRACE_FORMS = ((3, False), (12, False), (3, True), (12, True))  # (steps in flight, a macrotask after each)


@dataclass
class RoundsOptions:
    """What `webbuild bench --rounds` runs; n2 is --decode-tokens, n1 --short-decode, clips --max-clips and
    clip_tokens --max-new-tokens (the clips clicked once on load: TTFT, encoder)."""
    dist: Path
    rows: list[str]
    rounds: int = 3
    peer: Path | None = None
    n1: int = 16
    n2: int = 128
    clips: int = 1
    clip_tokens: int = 16
    prompt_tokens: int = 41
    timeout: float = 300
    allow_software: bool = False
    adapter: str | None = None
    timing: bool = False
    step_trace: int = 0
    first_use: list[float] = field(default_factory=list)
    first_use_ep: str = "webgpu"
    one_page: bool = False
    first_use_query: str = ""  # added to the first-use pages' address
    out: Path | None = None  # the result, written after every round (a run cut short keeps what it measured)


def run_rounds(o: RoundsOptions) -> dict:
    """The rounds, then the steps after them; the result with its markdown table (and first use's)."""
    rows = planned_rows(o)  # before anything starts: a wrong row is one line
    from playwright.sync_api import sync_playwright

    result: dict = {"options": {k: str(v) for k, v in vars(o).items()}, "rows": rows, "rounds": []}
    save = functools.partial(_save, result, o.out)
    with tempfile.TemporaryDirectory(prefix="webbuild-rounds-") as tmp:
        work = Path(tmp)
        peer_root = _peer_root(work, o.peer)
        choice = br.choose()
        result["browser"] = choice.describe()
        with site_url(str(counted_site(o.dist, work / "site"))) as (url, _), sync_playwright() as pw, \
                gpu_clock.ClockSampler() as clocks, _served(peer_root) as peer_url:
            browser = br.launch(pw, choice)
            try:
                result["gpu"] = gpu_report(browser)
                say(f"browser {choice.describe()}: {result['gpu']}")
                pages = open_pages(browser, url, peer_url, rows, o, result, save)
                for rnd in range(1, o.rounds + 1):
                    for name in rows:
                        result["rounds"].append(timed_round(name, rnd, pages, o, work, clocks))
                        save()
                after_rounds(browser, url, pages, o, result, clocks, save)
            finally:
                browser.close()
    result["table"] = [table_row(name, result) for name in rows]
    result["markdown"] = md_table(result["table"])
    save()
    return result


def planned_rows(o: RoundsOptions) -> list[str]:
    """The rows in round order; with --adapter, the adapter's row just before the site's (the same page)."""
    rows = list(o.rows)
    if o.adapter and SITE_ROW in rows:
        rows.insert(rows.index(SITE_ROW), LORA_ROW)
    if any(r in (PEER_ROW, "node-peer") for r in rows) and not o.peer:
        raise BenchError(f"rows {PEER_ROW} and node-peer need --peer DIR (the onnxruntime-genai builder's output)")
    unknown = [r for r in rows if r not in (SITE_ROW, PEER_ROW, LORA_ROW, *NODE_ROWS)
               and not r.startswith(f"{SITE_ROW}:")]
    if unknown:
        raise BenchError(f"unknown --row {', '.join(unknown)}: {SITE_ROW}[:QUERY], {PEER_ROW}, {', '.join(NODE_ROWS)}")
    return rows


def say(msg: str) -> None:
    """A progress line, time-stamped: a run takes minutes."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _save(result: dict, out: Path | None) -> None:
    if out:
        out.write_text(json.dumps(result, indent=1) + "\n")


# ---------------------------------------------------------------- the pages


def _peer_root(work: Path, peer: Path | None) -> Path:
    """The peer page's folder: the page, the harness modules it imports, the model and onnxruntime-web (the
    site's own pinned files) linked in."""
    root = work / "peer-www"
    root.mkdir()
    shutil.copy(PEER_PAGE, root / "index.html")
    for harness in ("counters.mjs", "timing.mjs"):
        shutil.copy(HARNESSES / harness, root / harness)
    if peer:
        (root / "model").symlink_to(peer.resolve())
        (root / "ort").symlink_to(ORT_FILES_DIR.resolve())
    return root


class _served:
    """A folder on loopback (the peer page's: a plain static server, as the page reaches its model and
    onnxruntime-web through symbolic links out of the folder); the context gives the page's address."""

    def __init__(self, folder: Path):
        class Quiet(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                     functools.partial(Quiet, directory=str(folder)))

    def __enter__(self) -> str:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/index.html"

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()


def software(adapter: dict | None) -> str | None:
    """Why this adapter is not a GPU, or None when it is one."""
    if not adapter or adapter.get("error"):
        return (adapter or {}).get("error", "no adapter")
    if adapter.get("isFallbackAdapter"):
        return "isFallbackAdapter is true"
    names = {k: adapter.get(k) for k in ("vendor", "architecture", "device", "description")}
    return "SwiftShader" if "swiftshader" in json.dumps(names).lower() else None


def check_adapter(adapter: dict | None, allow_software: bool, where: str) -> None:
    why = software(adapter)
    if why and not allow_software:
        raise BenchError(f"{where}: the WebGPU adapter is not the GPU ({why}): {adapter}")


def gpu_report(browser) -> dict:
    """Chromium's own account of its GPU (SystemInfo.getInfo): whether WebGPU runs on the hardware."""
    cdp = browser.new_browser_cdp_session()
    try:
        gpu = cdp.send("SystemInfo.getInfo").get("gpu", {})
    finally:
        cdp.detach()
    aux = gpu.get("auxAttributes", {})
    status = gpu.get("featureStatus") or {}
    return {"featureStatus": {k: v for k, v in status.items() if k in ("webgpu", "vulkan", "gpu_compositing", "webgl")},
            "glRenderer": aux.get("glRenderer"), "glImplementationParts": aux.get("glImplementationParts")}


class SitePage:
    """The built site's page (bench copy), loaded once; synth(n) runs n decode steps in its worker."""

    def __init__(self, browser, url: str, o: RoundsOptions, query: str = ""):
        self.page = browser.new_context().new_page()  # a fresh profile: no decode form kept from another page
        self.log, self.timeout = br.watch(self.page), o.timeout
        t0 = time.monotonic()
        # ep=webgpu: on SwiftShader (--allow-software) the page would take wasm; check_adapter guards the GPU
        br.open_page(self.page, url + f"?ep=webgpu&max_new_tokens={o.clip_tokens}" + (f"&{query}" if query else ""),
                     o.timeout)
        self.wall_s = time.monotonic() - t0
        self.state = self.page.evaluate("() => window.webbuild")
        if self.state["status"] != "ready":
            raise BenchError(f"the site did not load: {self.state['status']} {self.state['error']}")
        self.adapter = self.page.evaluate(ADAPTER_JS)
        info = self.state["info"]
        if info["ep"] != "webgpu" and not o.allow_software:
            raise BenchError(f"the site chose {info['ep']}, not WebGPU: {info.get('notice')}")
        self.worker = site_worker(self.page)
        buttons = self.page.eval_on_selector_all("button.sample", "bs => bs.map((b) => [b.id, b.dataset.text])")
        self.clips = []
        for i, text in buttons[: o.clips]:
            s = transcribe(self.page, Clip(i, text, button=i), o.timeout)
            self.clips.append({"clip": i, "text": s["text"], "error": s["error"], **(s.get("metrics") or {})})

    def synth(self, n: int, lora: str | None = None) -> dict:
        self.use(lora)
        return self.worker.evaluate("n => self.__wbSynth(n)", n)

    def timed(self, n: int, lora: str | None = None) -> dict | None:
        self.use(lora)
        return self.worker.evaluate("n => self.__wbTimedSynth(n)", n)

    def step_trace(self, n: int, in_flight: int, yield_each: bool) -> dict:
        return self.worker.evaluate("([n, o]) => self.__wbStepTrace(n, o)",
                                    [n, {"inFlight": in_flight, "yieldEach": yield_each}])

    def replay_burst(self, n: int, form: str) -> dict:
        return self.worker.evaluate("([n, form]) => self.__wbReplayBurst(n, form)", [n, form])

    def use(self, lora: str | None) -> None:
        """The page's picker on adapter `lora` (None: the base model), where it is not already."""
        if self.page.evaluate("() => window.webbuild.lora ?? null") == lora:
            return
        if lora is None:
            if error := switch_lora(self.page, None, self.timeout):
                raise BenchError(f"switching the adapter off failed: {error}")
        else:
            pick_adapter(self.page, self.state["info"], lora, self.timeout)


class PeerPage:
    """merged_page.html on the peer's model: runMerged(n) decodes n steps, timeMerged(n) one timed decode."""

    def __init__(self, browser, url: str, prompt_tokens: int):
        self.page = browser.new_context().new_page()
        self.log = br.watch(self.page)
        br.wait_for_gpu(self.page)
        self.page.goto(url)
        br.wait_for(self.page, "() => document.getElementById('out')?.textContent === 'ready'", 60)
        self.adapter = self.page.evaluate(ADAPTER_JS)
        self.loaded = self.page.evaluate(f"() => window.loadMerged({{ promptTokens: {prompt_tokens} }})")

    def run(self, n: int, prompt_tokens: int) -> dict:
        return self.page.evaluate(f"() => window.runMerged({n}, {prompt_tokens})")

    def timed(self, n: int, prompt_tokens: int) -> dict | None:
        return self.page.evaluate(f"() => window.timeMerged({n}, {prompt_tokens})")


def open_pages(browser, url: str, peer_url: str, rows: list[str], o: RoundsOptions, result: dict, save) -> dict:
    """The Chromium pages the rows need, each loaded once, checked to run on the GPU; their loads in `result`."""
    pages: dict = {}
    if SITE_ROW in rows:
        site = pages[SITE_ROW] = SitePage(browser, url, o)
        check_adapter(site.adapter, o.allow_software, "site page")
        result["site"] = {"info": site.state["info"], "adapter": site.adapter, "clips": site.clips,
                          "wall_s": round(site.wall_s, 1)}
        say(f"site: {site.state['info']['ep']} {site.state['info']['variant']} on {site.state['info']['gpu']!r}; "
            f"load {site.state['info']['load']['total_ms']:.0f} ms; requestAdapter {site.adapter}")
        save()
    for name in [r for r in rows if r.startswith(f"{SITE_ROW}:")]:
        page = pages[name] = SitePage(browser, url, o, name.split(":", 1)[1])
        check_adapter(page.adapter, o.allow_software, name)
        info = page.state["info"]
        result.setdefault("sites", {})[name] = {"info": info, "clips": page.clips, "wall_s": round(page.wall_s, 1)}
        say(f"{name}: decode {info.get('decode')!r}, choice {info.get('decodeChoice')}; "
            f"load {info['load']['total_ms']:.0f} ms")
        save()
    if PEER_ROW in rows:
        peer = pages[PEER_ROW] = PeerPage(browser, peer_url, o.prompt_tokens)
        check_adapter(peer.adapter, o.allow_software, "peer page")
        result["peer"] = {"adapter": peer.adapter, **peer.loaded}
        say(f"peer: {peer.loaded}")
        save()
    return pages


# ---------------------------------------------------------------- one round of one row


def timed_round(name: str, rnd: int, pages: dict, o: RoundsOptions, work: Path, clocks) -> dict:
    """Row `name`'s decodes of round `rnd`, with the GPU's clock over them."""
    t0, wall0 = time.monotonic(), gpu_clock.now()
    if name in NODE_ROWS:
        r = node_round(o.dist if name == "node-webbuild" else o.peer, work / f"{name}-{rnd}.json", o)
    elif name == PEER_ROW:
        peer = pages[PEER_ROW]
        r = page_round(peer.run(o.n1, o.prompt_tokens), peer.run(o.n2, o.prompt_tokens), o)
    else:
        page, lora = pages[SITE_ROW if name == LORA_ROW else name], o.adapter if name == LORA_ROW else None
        r = page_round(page.synth(o.n1, lora), page.synth(o.n2, lora), o)
    r |= {"row": name, "round": rnd, "wall_s": round(time.monotonic() - t0, 1),
          "clock": clocks.window(wall0, gpu_clock.now())}
    d = r["decode"]
    say(f"round {rnd} {name}: decode median {d['median']:.2f} ms (p10 {d['p10']:.2f}, p90 {d['p90']:.2f}, "
        f"n {d['n']}), prefill {r['prefill_ms']:.1f} ms, per token {r.get('per_token')}, {r['wall_s']} s, "
        f"GPU {gpu_clock.describe(r['clock'])}")
    return r


def page_round(short: dict, long: dict, o: RoundsOptions) -> dict:
    """A page's n1- and n2-step decodes: the long one's step times, its counts per token against the short one."""
    per_token = {k: round((long["counts"][k] - short["counts"][k]) / (o.n2 - o.n1), 2)
                 for k in COUNT_KEYS if k in short["counts"] and k in long["counts"]}
    return {"steps": long["steps"], "decode": spread(long["steps"]), "prefill_ms": long["prefill_ms"],
            "prompt_tokens": long["prompt_tokens"], "ttft_ms": long.get("ttft_ms"), "kv": long.get("kv"),
            "counts": [short["counts"], long["counts"]], "per_token": per_token}


def node_round(target: Path | None, report: Path, o: RoundsOptions) -> dict:
    """`webbuild bench TARGET --ep webgpu` under Node + Dawn; its report counts the WebGPU calls itself."""
    from webbuild.tools.bench import run_node

    assert target is not None  # planned_rows: the peer row needs --peer
    clips = o.clips if (target / "model" / "manifest.json").is_file() else None
    b = run_node(target, "webgpu", o.n2, max_clips=clips, timeout=o.timeout)
    report.write_text(json.dumps(b))
    synth = b["synthetic_decode"]
    return {"steps": None, "decode": synth["ms_per_token"], "prefill_ms": synth["prefill_ms"],
            "prompt_tokens": synth["prompt_tokens"], "ttft_ms": b["summary"].get("ttft_ms"), "load": b["load"],
            "adapter": b.get("adapter"), "clips": b.get("clips"), "per_token": b.get("counters_per_token")}


# ---------------------------------------------------------------- after the rounds


def after_rounds(browser, url: str, pages: dict, o: RoundsOptions, result: dict, clocks, save) -> None:
    """--step-trace, --timing (the timing wrap is off during the rounds), --first-use; the pages' errors."""
    if o.step_trace:
        sites = [p for name, p in pages.items() if name != PEER_ROW]
        captured = next((p for p in sites if p.state["info"]["decode"] == "captured"), None)
        if captured is None:
            raise BenchError("--step-trace needs a page decoding captured steps "
                             f"(add --row {SITE_ROW}:decode=captured)")
        # alternated over as many rounds as the rows (at most 2: each form's figure is a median already)
        result["step_trace"] = step_traces(captured, o.step_trace, clocks, min(o.rounds, 2))
        result["replay_bursts"] = replay_bursts(captured, o.step_trace, clocks, min(o.rounds, 2))
        save()
    if o.timing:
        result["timing_per_token"] = timed_decodes(pages, o)
        save()
    if o.first_use:
        result["first_use"] = {"rows": first_use_step(browser, url, o, clocks)}
        result["first_use"]["markdown"] = first_use_table(result["first_use"]["rows"])
        save()
    logs = [p.log for p in pages.values()]
    result["console_errors"] = [c for lg in logs for c in lg["console"] if c.startswith("error")][:20]
    result["page_errors"] = [e for lg in logs for e in lg["errors"]][:20]


def timed_decodes(pages: dict, o: RoundsOptions) -> dict:
    """timing.mjs's timing_per_token (where a token's time goes, GPU time per kernel) of an n2-step decode on
    each Chromium page, as bench.mjs reports it under Node."""
    site, peer = pages.get(SITE_ROW), pages.get(PEER_ROW)
    runs = ((LORA_ROW, site and o.adapter and (lambda: site.timed(o.n2, o.adapter))),
            (SITE_ROW, site and (lambda: site.timed(o.n2))),
            (PEER_ROW, peer and (lambda: peer.timed(o.n2, o.prompt_tokens))))
    out = {}
    for name, timed in runs:
        if timed:
            out[name] = timed()
            say(f"timing {name}: {json.dumps(out[name])[:600]}")
    return out


def step_traces(page: SitePage, n: int, clocks, rounds: int = 2) -> list[dict]:
    """The captured decode's steps timed one by one (synth_hook.js __wbStepTrace) in each of STEP_TRACE_FORMS,
    alternated over `rounds`: per token, its issue (session.run and the read-back's copy submitted), the
    read-back's wait after it, the time between issues, with the GPU's clock."""
    out = []
    for rnd in range(1, rounds + 1):
        for in_flight, yield_each in STEP_TRACE_FORMS:
            wall0 = gpu_clock.now()
            t = page.step_trace(n, in_flight, yield_each)
            rows = [r for r in t["trace"] if r["t2"] is not None]
            out.append({"round": rnd, "in_flight": in_flight, "yield_each": yield_each,
                        "decode": spread(t["steps"]),
                        "issue_ms": spread([r["t1"] - r["t0"] for r in rows]),
                        "readback_wait_ms": spread([r["t2"] - r["t1"] for r in rows]),
                        "issue_interval_ms": spread([b["t0"] - a["t0"] for a, b in zip(rows, rows[1:])]),
                        "clock": clocks.window(wall0, gpu_clock.now())})
            s = out[-1]
            say(f"step trace {rnd} in flight {in_flight}{' yield' if yield_each else ''}: decode "
                f"{s['decode']['median']:.2f} ms, issue {s['issue_ms']['median']:.2f}, read-back wait "
                f"{s['readback_wait_ms']['median']:.2f}, interval {s['issue_interval_ms']['median']:.2f}, "
                f"GPU {gpu_clock.describe(s['clock'])}")
    return out


REPLAY_FORMS = ("runs", "map", "done")  # synth_hook.js __wbReplayBurst's forms


def replay_bursts(page: SitePage, n: int, clocks, rounds: int = 2) -> list[dict]:
    """The captured step replayed n times back to back in each of REPLAY_FORMS, alternated over `rounds`: the wall
    time per step with no read-back, with one mapAsync a step, and with each step waited for."""
    out = []
    for rnd in range(1, rounds + 1):
        for form in REPLAY_FORMS:
            wall0 = gpu_clock.now()
            b = page.replay_burst(n, form)
            out.append({"round": rnd, **b, "clock": clocks.window(wall0, gpu_clock.now())})
            say(f"replay burst {rnd} {form}: {b['per_step_ms']:.2f} ms a step ({n} steps issued in "
                f"{b['issued_ms']:.1f} ms, done in {b['wall_ms']:.1f}), GPU {gpu_clock.describe(out[-1]['clock'])}")
    return out


def first_use_step(browser, url: str, o: RoundsOptions, clocks) -> list[dict]:
    """One fresh page per clip length (--one-page: one page, the lengths in turn): its load (ms, with parts, the
    GPU's clock in each of its steps) and its first clip (first_use.py row)."""
    samples = json.loads((o.dist / "samples.json").read_text())["samples"]
    clips = fu.speech(o.dist, samples)
    rows: list[dict] = []
    for group in ([o.first_use] if o.one_page else [[s] for s in o.first_use]):
        context = browser.new_context()  # a fresh profile: no cached shards, no compiled pipelines
        try:
            page = context.new_page()
            t0 = time.monotonic()
            query = f"?ep={o.first_use_ep}&warm=shapes" + (f"&{o.first_use_query}" if o.first_use_query else "")
            br.open_page(page, url + query, o.timeout)
            wall = time.monotonic() - t0
            state = page.evaluate("() => window.webbuild")
            if state["status"] != "ready":
                raise BenchError(f"the site did not load: {state['status']} {state['error']}")
            if state["info"]["ep"] != o.first_use_ep and not o.allow_software:
                raise BenchError(f"the site chose {state['info']['ep']}, not {o.first_use_ep}")
            worker = site_worker(page)
            ready = worker.evaluate("() => self.__gpuCounters.counts.pipelines")
            load = {k: round(v) for k, v in state["info"]["load"].items()}
            timeline = timeline_pipelines(state["info"], worker.evaluate("() => self.__gpuCounters.created"),
                                          clocks.window, worker.evaluate("() => performance.timeOrigin"))
            for seconds in group:
                r = fu.row(seconds, fu.first_use(worker, fu.clip_of(seconds, clips), o.clip_tokens))
                rows.append({**r, "load": load, "load_wall_s": round(wall, 2), "pipelines_at_ready": ready,
                             "load_timeline": timeline})
                say(f"first use {seconds} s: TTFT {r['ttft_ms']} ms (encoder {r['encoder_ms']}, prefill "
                    f"{r['prefill_ms']}), {r['new_pipelines']} new pipelines "
                    f"{r['encoder_pipelines'] + r['decoder_pipelines']}; load {load}, {ready} pipelines at ready")
        finally:
            context.close()
    return rows


# ---------------------------------------------------------------- the tables


def table_row(name: str, result: dict) -> dict:
    """Row `name` over its rounds: median of the round medians, the steps' spread, counts, load, TTFT, clock."""
    rs = [r for r in result["rounds"] if r["row"] == name]
    meds = [r["decode"]["median"] for r in rs]
    steps = [s for r in rs for s in (r.get("steps") or [])]
    if name == PEER_ROW:
        load, ttft = result["peer"]["load"], None
    elif name in NODE_ROWS:
        load, ttft = rs[0]["load"] if rs else None, _median([r.get("ttft_ms") for r in rs])
    else:
        page = result["sites"][name] if ":" in name else result["site"]
        load, ttft = page["info"]["load"], _median([c.get("ttft_ms") for c in page["clips"]])
    # Node rounds bring no per-step times back: their own spreads stand in
    all_steps = ({"p10": _median([r["decode"]["p10"] for r in rs]), "p90": _median([r["decode"]["p90"] for r in rs]),
                  "median": _median(meds), "n": sum(r["decode"]["n"] for r in rs)} if name in NODE_ROWS
                 else {k: round(v, 2) if isinstance(v, float) else v for k, v in spread(steps).items()})
    return {"row": name, "rounds": len(rs), "decode_round_medians": [round(m, 2) for m in meds],
            "decode_median_of_rounds": _median(meds), "decode_all_steps": all_steps,
            "per_token": next((r.get("per_token") for r in rs if r.get("per_token")), None),
            "prefill_ms": [round(r["prefill_ms"], 1) for r in rs],
            "prompt_tokens": rs[0]["prompt_tokens"] if rs else None,
            "load": load, "ttft_ms": ttft, "clock": gpu_clock.merged([r.get("clock") for r in rs])}


def md_table(rows: list[dict]) -> str:
    head = ("| row | decode ms/token, median of round medians (round medians) | p10 / p90 (all steps) "
            "| dispatches / submits / read-backs / writeBuffer per token | prefill (synthetic) | TTFT (clip) "
            "| load (sessions) | GPU SM clock, median (min-max), utilisation |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- |")
    lines = [head]
    for r in rows:
        d, pt, load = r["decode_all_steps"], r["per_token"] or {}, r.get("load") or {}
        pf = _median(r["prefill_ms"])
        ttft = r.get("ttft_ms")
        lines.append(
            f"| {r['row']} | {r['decode_median_of_rounds']} ({', '.join(map(str, r['decode_round_medians']))}) | "
            f"{d['p10']} / {d['p90']} | "
            f"{_dispatches(pt)} / {pt.get('submits')} / {pt.get('readbacks')} / {pt.get('write_buffers')} | "
            f"{pf} ms ({r['prompt_tokens']} tokens) | {'-' if ttft is None else f'{ttft:.0f} ms'} | "
            f"{load.get('total_ms', 0) / 1000:.1f} s ({(load.get('session_ms') or 0) / 1000:.1f} s) | "
            f"{gpu_clock.describe(r.get('clock'))} |")
    return "\n".join(lines)


def _dispatches(per_token: dict) -> str:
    """A row's dispatches per token, with how many of them are indirect where any are."""
    indirect = per_token.get("indirect")
    return f"{per_token.get('dispatches')}" + (f" ({indirect} indirect)" if indirect else "")


def timeline_pipelines(info: dict, created: list[dict], clock: Callable[[float, float], dict | None] | None = None,
                       time_origin: float | None = None) -> list[dict] | None:
    """The ready info's load timeline, each step with the GPU pipelines made within it (`pipelines`, their names in
    `made`: the counters' `created`, stamped in the worker's clock as `loadOrigin` is); None for a page runtime
    without a timeline. With `clock` (a ClockSampler's window, wall seconds) and the worker's performance.timeOrigin
    (ms since the epoch), each step gets the GPU's clock over its own time (`clock`): a step slow on one GPU only
    may be one run at a low clock."""
    steps, origin = info.get("loadTimeline"), info.get("loadOrigin")
    if steps is None or origin is None:
        return steps
    out = []
    for s in steps:
        made = [c["name"] for c in created if s["start_ms"] <= c["at"] - origin <= s["end_ms"]]
        step = {**s, "pipelines": len(made), "made": made}
        if clock and time_origin is not None:
            wall = [(time_origin + origin + s[k]) / 1000 for k in ("start_ms", "end_ms")]
            step["clock"] = clock(*wall)
        out.append(step)
    return out


def first_use_table(rows: list[dict]) -> str:
    head = ("| first clip | TTFT | encoder | prefill (tokens) | new pipelines (names) | load | download "
            "| sha256 (summed) | sessions (encoder warm-up within) | warm-up (decode forms, long-run check within) |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    lines = [head]
    for r in rows:
        ld, names = r["load"], r["encoder_pipelines"] + r["decoder_pipelines"]
        lines.append(f"| {r['seconds']} s | {r['ttft_ms']:.0f} ms | {r['encoder_ms']:.0f} ms | "
                     f"{r['prefill_ms']:.0f} ms ({r['prompt_tokens']}) | {r['new_pipelines']} {names or ''} | "
                     f"{ld['total_ms']} ms | {ld['download_ms']} ms | {ld.get('hash_ms', '-')} ms | "
                     f"{ld['session_ms']} ms ({ld.get('encoder_warmup_ms', '-')} ms) | {ld['warmup_ms']} ms "
                     f"({ld.get('decode_form_ms', '-')}, {ld.get('runs_check_ms', '-')} ms) |")
    return "\n".join(lines)


def _median(xs):
    xs = sorted(x for x in xs if x is not None)
    return round(xs[len(xs) // 2], 2) if xs else None

#!/usr/bin/env python3
"""The 0.6b build in Chromium on the GPU beside Node + Dawn and the genai peer, with WebGPU call
counters (issue 15 parts 2 and 3). Run on the GPU machine by scripts/chrome_gpu_bench.sh; the browser
is webbuild's own choice (WEBBUILD_BROWSER, WEBBUILD_BROWSER_ARGS), launched through Playwright.
webbuild is imported as a package: installed, or its checkout on PYTHONPATH.

Rows, alternated in rounds (A B C, A B C, ...):
  chromium-webbuild  the built site's own page and worker; its worker.js gets the counters in front and
                     a synthetic-decode hook behind (webbuild/tools/bench counted_site: a hard-linked copy
                     of the site, served as is; the hook is synth_hook.js): the site's Recogniser decodes
                     n greedy steps past any end token after 1 s of silence, as
                     webbuild/tools/bench/bench.mjs does under Node
  chromium-peer      a merged decoder (onnxruntime-genai's model.onnx) on scripts/chrome_gpu_merged.html,
                     as webbuild/tools/bench/merged.mjs runs it under Node
  node-webbuild      `webbuild bench DIST --ep webgpu` (Node + Dawn), counted by its own report
                     (webbuild/tools/bench/counters.mjs)
  node-peer          (optional) `webbuild bench PEER --ep webgpu`
  chromium-webbuild:QUERY  the same page with QUERY added to its address (a page of its own), e.g.
                     chromium-webbuild:decode=plain, chromium-webbuild:decode=captured&gpu_validation=wgpuOnly:
                     a decode form forced (runtime/decode-form.js) against the page's own choice
  chromium-webbuild-lora  with --adapter NAME: the site's page with its picker on NAME, just before the
                     chromium-webbuild row, which picks it off again: adapter on and off alternated on one
                     page (with --timing, both timed too)
--first-use 1,2.5,5,8,15,30 (after the rounds): for each length a fresh page (a new browser context: empty
cache, so the model downloads and every shard is hashed again) loads the counted site, then transcribes one
clip of that length as one chunk (webbuild/tools/bench/first_use.py: the samples' speech cut to the length):
its TTFT, encoder and prefill times, the WebGPU pipelines compiled for it (0 once the warm-up covers its
shapes), and the page's load and its parts (download, sha256, verified, sessions, warm-up). `--rows ''`
runs that step alone; --one-page runs the lengths in turn on one page (what tests/test_first_use.py checks).
Per decode token counts = (counts of an n2-step decode - counts of an n1-step decode) / (n2 - n1).
The Chromium pages load once (their load time is reported once); every round runs n1 and n2 steps.
The page's WebGPU adapter must be the GPU: a fallback or SwiftShader adapter stops the run.
Every round of every row carries the GPU's SM clock and utilisation over its time (nvidia-smi every 50 ms,
webbuild/tools/bench/gpu_clock.py), and the table their median, min and max.

  python3 scripts/chrome_gpu_bench.py --dist DIST --peer PEER --rounds 3 --out rounds.json
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from webbuild.errors import BenchError
from webbuild.tools import browser as br
from webbuild.tools.bench import HARNESSES, gpu_clock
from webbuild.tools.bench import first_use as fu
from webbuild.tools.bench.instrument import counted_site
from webbuild.tools.bench.page_bench import pick_adapter, site_worker, spread
from webbuild.tools.verify.visits import Clip, site_url, switch_lora, transcribe

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

HERE = Path(__file__).resolve().parent  # chrome_gpu_merged.html lies beside this script
REPO = HERE.parent

COUNT_KEYS = ("dispatches", "submits", "readbacks", "write_buffers", "write_bytes", "bind_groups", "buffers")
LORA_ROW = "chromium-webbuild-lora"  # --adapter: the site's page with the adapter picked


def serve(folder: Path) -> http.server.ThreadingHTTPServer:
    """The peer page's folder on loopback. A plain static server, not webbuild's SiteServer: the page
    reaches the peer model and onnxruntime-web through symbolic links out of the folder."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a):
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def software(adapter: dict | None) -> str | None:
    """Why this adapter is not a GPU, or None when it is one."""
    if not adapter or adapter.get("error"):
        return (adapter or {}).get("error", "no adapter")
    if adapter.get("isFallbackAdapter"):
        return "isFallbackAdapter is true"
    names = {k: adapter.get(k) for k in ("vendor", "architecture", "device", "description")}
    if "swiftshader" in json.dumps(names).lower():
        return "SwiftShader"
    return None


def check_adapter(adapter: dict | None, allow_software: bool, where: str) -> None:
    why = software(adapter)
    if why and not allow_software:
        raise SystemExit(f"FATAL: {where}: the WebGPU adapter is not the GPU ({why}): {adapter}")


def per_token(short: dict, long: dict, n1: int, n2: int) -> dict:
    return {k: round((long[k] - short[k]) / (n2 - n1), 2) for k in COUNT_KEYS if k in short and k in long}


def counted_copy(dist: Path, dest: Path) -> Path:
    """The site hard-linked into dest, worker.js with the counters and the synthetic-decode hook
    (webbuild/tools/bench: counted_site, the copy `webbuild bench --runtime browser` serves too)."""
    if dest.exists():
        shutil.rmtree(dest)
    return counted_site(dist, dest)


def gpu_report(browser) -> dict:
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
    """The built site's page (counted copy), loaded once; synth(n) runs n decode steps in its worker."""

    def __init__(self, browser, url: str, args, query: str = ""):
        self.page = browser.new_context().new_page()  # a fresh profile: no decode form kept from another page
        self.log, self.timeout = br.watch(self.page), args.timeout
        t0 = time.monotonic()
        # ep=webgpu: on SwiftShader (--allow-software) the page would take wasm; check_adapter guards the GPU
        br.open_page(self.page, url + f"?ep=webgpu&max_new_tokens={args.clip_tokens}" + (f"&{query}" if query else ""),
                     args.timeout)
        self.wall_s = time.monotonic() - t0
        self.state = self.page.evaluate("() => window.webbuild")
        if self.state["status"] != "ready":
            raise SystemExit(f"FATAL: the site did not load: {self.state['status']} {self.state['error']}")
        self.adapter = self.page.evaluate(ADAPTER_JS)
        info = self.state["info"]
        if info["ep"] != "webgpu" and not args.allow_software:
            raise SystemExit(f"FATAL: the site chose {info['ep']}, not WebGPU: {info.get('notice')}")
        self.worker = site_worker(self.page)  # the counted copy's worker, with synth_hook.js
        buttons = self.page.eval_on_selector_all("button.sample", "bs => bs.map((b) => [b.id, b.dataset.text])")
        self.clips = []
        for i, text in buttons[: args.clips]:
            s = transcribe(self.page, Clip(i, text, button=i), args.timeout)
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

    def use(self, lora: str | None) -> None:
        """The page's picker on adapter `lora` (None: the base model), where it is not already."""
        if self.page.evaluate("() => window.webbuild.lora ?? null") == lora:
            return
        if lora is None:
            if error := switch_lora(self.page, None, self.timeout):
                raise SystemExit(f"FATAL: switching the adapter off failed: {error}")
        else:
            try:
                pick_adapter(self.page, self.state["info"], lora, self.timeout)
            except BenchError as exc:  # an adapter the site does not have: one line, not a traceback
                raise SystemExit(f"FATAL: --adapter: {exc}") from None


class PeerPage:
    def __init__(self, browser, url: str, args):
        self.page = browser.new_context().new_page()
        self.log = br.watch(self.page)
        br.wait_for_gpu(self.page)
        self.page.goto(url)
        br.wait_for(self.page, "() => document.getElementById('out')?.textContent === 'ready'", 60)
        self.adapter = self.page.evaluate(ADAPTER_JS)
        self.loaded = self.page.evaluate(f"() => window.loadMerged({{ promptTokens: {args.prompt_tokens} }})")

    def run(self, n: int, prompt_tokens: int) -> dict:
        return self.page.evaluate(f"() => window.runMerged({n}, {prompt_tokens})")

    def timed(self, n: int, prompt_tokens: int) -> dict | None:
        return self.page.evaluate(f"() => window.timeMerged({n}, {prompt_tokens})")


def timed_decodes(site, peer, args) -> dict:
    """timing.mjs's timing_per_token (where a token's time goes, GPU time per kernel) of an n2-step decode
    on each Chromium page, as bench.mjs reports it under Node."""
    out = {}
    for name, timed in ((LORA_ROW, site and args.adapter and (lambda: site.timed(args.n2, args.adapter))),
                        ("chromium-webbuild", site and (lambda: site.timed(args.n2))),
                        ("chromium-peer", peer and (lambda: peer.timed(args.n2, args.prompt_tokens)))):
        if timed:
            out[name] = timed()
            log(f"timing {name}: {json.dumps(out[name])[:600]}")
    return out


STEP_TRACE_FORMS = ((3, False), (12, False), (3, True), (12, True))  # (steps in flight, a macrotask after each)


def step_traces(page: SitePage, n: int, clocks, rounds: int = 2) -> list[dict]:
    """--step-trace: the captured decode's steps timed one by one (synth_hook.js __wbStepTrace) in each of
    STEP_TRACE_FORMS, alternated over `rounds`: per token, its issue (session.run and the read-back's copy
    submitted), the read-back's wait after it, the time between issues, with the GPU's clock."""
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
            o = out[-1]
            log(f"step trace {rnd} in flight {in_flight}{' yield' if yield_each else ''}: decode "
                f"{o['decode']['median']:.2f} ms, issue {o['issue_ms']['median']:.2f}, read-back wait "
                f"{o['readback_wait_ms']['median']:.2f}, interval {o['issue_interval_ms']['median']:.2f}, "
                f"GPU {gpu_clock.describe(o['clock'])}")
    return out


def node_bench(target: Path, tokens: int, workdir: Path, tag: str, args) -> dict:
    """`webbuild bench TARGET --ep webgpu` under Node + Dawn; its report counts the WebGPU calls itself
    (counters_per_token: a tokens/4 decode against the tokens one)."""
    report = workdir / f"{tag}.json"
    cmd = [sys.executable, "-m", "webbuild.cli", "bench", str(target), "--ep", "webgpu", "--decode-tokens", str(tokens),
           "--json", str(report)]
    if (target / "model" / "manifest.json").is_file():
        cmd += ["--max-clips", str(args.clips)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr[-2000:]} {proc.stdout[-1000:]}")
    return json.loads(report.read_text())


def row_of(name: str, rounds: list[dict], load: dict | None, extra: dict) -> dict:
    meds = [r["decode"]["median"] for r in rounds]
    steps = [s for r in rounds for s in r["steps"]]
    return {"row": name, "rounds": len(rounds), "decode_round_medians": [round(m, 2) for m in meds],
            "decode_median_of_rounds": round(sorted(meds)[len(meds) // 2], 2) if meds else None,
            "decode_all_steps": {k: round(v, 2) if isinstance(v, float) else v for k, v in spread(steps).items()},
            "per_token": rounds[0].get("per_token") if rounds else None,
            "prefill_ms": [round(r["prefill_ms"], 1) for r in rounds],
            "prompt_tokens": rounds[0]["prompt_tokens"] if rounds else None,
            "load": load, **extra}


def first_use_step(browser, url: str, lengths: list[float], args) -> list[dict]:
    """One fresh page per length (--one-page: one page, the lengths in turn): its load (ms, with parts) and its
    first clip (first_use.py row)."""
    samples = json.loads((args.dist / "samples.json").read_text())["samples"]
    clips = fu.speech(args.dist, samples)
    rows: list[dict] = []
    for group in ([lengths] if args.one_page else [[s] for s in lengths]):
        context = browser.new_context()  # a fresh profile: no cached shards, no compiled pipelines
        try:
            page = context.new_page()
            t0 = time.monotonic()
            br.open_page(page, url + f"?ep={args.first_use_ep}&warm=shapes", args.timeout)
            wall = time.monotonic() - t0
            state = page.evaluate("() => window.webbuild")
            if state["status"] != "ready":
                raise SystemExit(f"FATAL: the site did not load: {state['status']} {state['error']}")
            if state["info"]["ep"] != args.first_use_ep and not args.allow_software:
                raise SystemExit(f"FATAL: the site chose {state['info']['ep']}, not {args.first_use_ep}")
            worker = site_worker(page)
            ready = worker.evaluate("() => self.__gpuCounters.counts.pipelines")
            load = {k: round(v) for k, v in state["info"]["load"].items()}
            for seconds in group:
                r = fu.row(seconds, fu.first_use(worker, fu.clip_of(seconds, clips), args.clip_tokens))
                rows.append({**r, "load": load, "load_wall_s": round(wall, 2), "pipelines_at_ready": ready})
                log(f"first use {seconds} s: TTFT {r['ttft_ms']} ms (encoder {r['encoder_ms']}, prefill "
                    f"{r['prefill_ms']}), {r['new_pipelines']} new pipelines "
                    f"{r['encoder_pipelines'] + r['decoder_pipelines']}; load {load}, {ready} pipelines at ready")
        finally:
            context.close()
    return rows


def first_use_table(rows: list[dict]) -> str:
    head = ("| first clip | TTFT | encoder | prefill (tokens) | new pipelines (names) | load | download "
            "| sha256 (summed) | sessions (encoder warm-up within) | warm-up |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    lines = [head]
    for r in rows:
        ld, names = r["load"], r["encoder_pipelines"] + r["decoder_pipelines"]
        lines.append(f"| {r['seconds']} s | {r['ttft_ms']:.0f} ms | {r['encoder_ms']:.0f} ms | "
                     f"{r['prefill_ms']:.0f} ms ({r['prompt_tokens']}) | {r['new_pipelines']} {names or ''} | "
                     f"{ld['total_ms']} ms | {ld['download_ms']} ms | {ld.get('hash_ms', '-')} ms | "
                     f"{ld['session_ms']} ms ({ld.get('encoder_warmup_ms', '-')} ms) | {ld['warmup_ms']} ms |")
    return "\n".join(lines)


def md_table(rows: list[dict]) -> str:
    head = ("| row | decode ms/token, median of round medians (round medians) | p10 / p90 (all steps) "
            "| dispatches / submits / read-backs / writeBuffer per token | prefill (synthetic) | TTFT (clip) "
            "| load (sessions) | GPU SM clock, median (min-max), utilisation |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- |")
    lines = [head]
    for r in rows:
        d, pt, load = r["decode_all_steps"], r["per_token"] or {}, r.get("load") or {}
        pf = sorted(r["prefill_ms"])[len(r["prefill_ms"]) // 2] if r["prefill_ms"] else None
        ttft = r.get("ttft_ms")
        lines.append(
            f"| {r['row']} | {r['decode_median_of_rounds']} ({', '.join(map(str, r['decode_round_medians']))}) | "
            f"{d['p10']} / {d['p90']} | "
            f"{pt.get('dispatches')} / {pt.get('submits')} / {pt.get('readbacks')} / {pt.get('write_buffers')} | "
            f"{pf} ms ({r['prompt_tokens']} tokens) | {'-' if ttft is None else f'{ttft:.0f} ms'} | "
            f"{load.get('total_ms', 0) / 1000:.1f} s ({(load.get('session_ms') or 0) / 1000:.1f} s) | "
            f"{gpu_clock.describe(r.get('clock'))} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dist", type=Path, required=True, help="the built site (webbuild model.yaml -o DIST)")
    ap.add_argument("--peer", type=Path, help="a merged decoder folder (onnxruntime-genai builder output)")
    ap.add_argument("--ort", type=Path, default=REPO / "node_modules/onnxruntime-web/dist",
                    help="onnxruntime-web dist for the peer page")
    ap.add_argument("--rows", default="chromium-webbuild,chromium-peer,node-webbuild")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n1", type=int, default=16, help="short decode (counters)")
    ap.add_argument("--n2", type=int, default=128, help="long decode (times and counters)")
    ap.add_argument("--clips", type=int, default=1, help="sample clips clicked once on load (TTFT, encoder)")
    ap.add_argument("--clip-tokens", type=int, default=16, help="max_new_tokens of those clips")
    ap.add_argument("--prompt-tokens", type=int, default=41)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--allow-software", action="store_true",
                    help="do not stop on a SwiftShader adapter (CPU smoke test)")
    ap.add_argument("--first-use", default="",
                    help="after the rounds: a fresh page per clip length (seconds, comma-separated; e.g. "
                         "1,2.5,5,8,15,30), its load and its first clip's TTFT and new pipelines")
    ap.add_argument("--first-use-ep", choices=("webgpu", "wasm"), default="webgpu",
                    help="the page's ?ep= for --first-use (wasm: whether the CPU path has a first-use cost: "
                         "list a length twice)")
    ap.add_argument("--one-page", action="store_true",
                    help="--first-use on one page, the lengths in turn (the pipelines each length adds after the "
                         "warm-up and the ones before it; one load instead of one per length)")
    ap.add_argument("--timing", action="store_true",
                    help="after the rounds, cut one decode of each Chromium page into phases and GPU kernel times")
    ap.add_argument("--adapter", metavar="NAME",
                    help=f"a LoRA adapter of the site: each round runs row {LORA_ROW} (the page's picker on NAME) "
                         "before chromium-webbuild (picked off again) on the same page; with --timing both are timed")
    ap.add_argument("--step-trace", type=int, default=0, metavar="N",
                    help="after the rounds, N captured steps timed one by one, with 3 and 12 steps in flight, with and "
                         "without a macrotask after each issue (a page decoding captured steps: a row "
                         "chromium-webbuild:decode=captured)")
    ap.add_argument("--out", type=Path, default=Path("chrome-gpu-bench.json"))
    args = ap.parse_args()
    rows = [r for r in args.rows.split(",") if r]
    if args.adapter and "chromium-webbuild" in rows:  # the same page with the adapter on, just before it
        rows.insert(rows.index("chromium-webbuild"), LORA_ROW)
    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="cgb-"))
    result = {"args": {k: str(v) for k, v in vars(args).items()}, "rows": {}, "rounds": []}

    def save():
        args.out.write_text(json.dumps(result, indent=1) + "\n")

    counted = counted_copy(args.dist, work / "site")
    peer_root = work / "peer-www"
    peer_root.mkdir()
    shutil.copy(HERE / "chrome_gpu_merged.html", peer_root / "index.html")
    for harness in ("counters.mjs", "timing.mjs"):  # the page imports them
        shutil.copy(HARNESSES / harness, peer_root / harness)
    if args.peer:
        (peer_root / "model").symlink_to(args.peer.resolve())
        (peer_root / "ort").symlink_to(args.ort.resolve())
    choice = br.choose()
    result["browser"] = choice.describe()
    with site_url(str(counted)) as (url, _), sync_playwright() as pw, gpu_clock.ClockSampler() as clocks:
        httpd = serve(peer_root)
        peer_url = f"http://127.0.0.1:{httpd.server_address[1]}/index.html"
        browser = br.launch(pw, choice)
        try:
            result["gpu"] = gpu_report(browser)
            log(f"browser {choice.describe()}: {result['gpu']}")
            site = peer = None
            if "chromium-webbuild" in rows:
                site = SitePage(browser, url, args)
                check_adapter(site.adapter, args.allow_software, "site page")
                info = site.state["info"]
                result["site"] = {"info": info, "adapter": site.adapter, "clips": site.clips,
                                  "wall_s": round(site.wall_s, 1)}
                log(f"site: {info['ep']} {info['variant']} on {info['gpu']!r}; "
                    f"load {info['load']['total_ms']:.0f} ms; requestAdapter {site.adapter}")
                log(f"clips: {site.clips}")
                save()
            sites = {name: SitePage(browser, url, args, name.split(":", 1)[1]) for name in rows
                     if name.startswith("chromium-webbuild:")}
            for name, page in sites.items():
                check_adapter(page.adapter, args.allow_software, name)
                info = page.state["info"]
                result.setdefault("sites", {})[name] = {"info": info, "clips": page.clips,
                                                        "wall_s": round(page.wall_s, 1)}
                log(f"{name}: decode {info.get('decode')!r}, choice {info.get('decodeChoice')}; "
                    f"load {info['load']['total_ms']:.0f} ms")
                save()
            if "chromium-peer" in rows:
                peer = PeerPage(browser, peer_url, args)
                check_adapter(peer.adapter, args.allow_software, "peer page")
                result["peer"] = {"adapter": peer.adapter, **peer.loaded}
                log(f"peer: {peer.loaded}")
                save()
            for rnd in range(1, args.rounds + 1):
                for name in rows:
                    t0, wall0 = time.monotonic(), gpu_clock.now()
                    if name.startswith("chromium-webbuild:"):
                        a, b = sites[name].synth(args.n1), sites[name].synth(args.n2)
                        r = {"steps": b["steps"], "prefill_ms": b["prefill_ms"],
                             "prompt_tokens": b["prompt_tokens"], "ttft_ms": b["ttft_ms"],
                             "per_token": per_token(a["counts"], b["counts"], args.n1, args.n2)}
                    elif name in ("chromium-webbuild", LORA_ROW):
                        lora = args.adapter if name == LORA_ROW else None
                        a, b = site.synth(args.n1, lora), site.synth(args.n2, lora)
                        r = {"steps": b["steps"], "prefill_ms": b["prefill_ms"],
                             "prompt_tokens": b["prompt_tokens"], "ttft_ms": b["ttft_ms"],
                             "counts": [a["counts"], b["counts"]],
                             "per_token": per_token(a["counts"], b["counts"], args.n1, args.n2)}
                    elif name == "chromium-peer":
                        a, b = peer.run(args.n1, args.prompt_tokens), peer.run(args.n2, args.prompt_tokens)
                        r = {"steps": b["steps"], "prefill_ms": b["prefill_ms"], "prompt_tokens": b["prompt_tokens"],
                             "kv": b["kv"], "counts": [a["counts"], b["counts"]],
                             "per_token": per_token(a["counts"], b["counts"], args.n1, args.n2)}
                    elif name in ("node-webbuild", "node-peer"):
                        target = args.dist if name == "node-webbuild" else args.peer
                        b = node_bench(target, args.n2, work, f"{name}-{rnd}-{args.n2}", args)
                        synth = b["synthetic_decode"]
                        r = {"steps": None, "decode": synth["ms_per_token"], "prefill_ms": synth["prefill_ms"],
                             "prompt_tokens": synth["prompt_tokens"], "ttft_ms": b["summary"].get("ttft_ms"),
                             "load": b["load"], "adapter": b.get("adapter"), "clips": b.get("clips"),
                             "per_token": b.get("counters_per_token")}
                    else:
                        raise SystemExit(f"unknown row {name}")
                    if r.get("steps") is not None:
                        r["decode"] = spread(r["steps"])
                    r |= {"row": name, "round": rnd, "wall_s": round(time.monotonic() - t0, 1),
                          "clock": clocks.window(wall0, gpu_clock.now())}
                    result["rounds"].append(r)
                    d = r["decode"]
                    log(f"round {rnd} {name}: decode median {d['median']:.2f} ms "
                        f"(p10 {d['p10']:.2f}, p90 {d['p90']:.2f}, n {d['n']}), "
                        f"prefill {r['prefill_ms']:.1f} ms, per token {r.get('per_token')}, {r['wall_s']} s, "
                        f"GPU {gpu_clock.describe(r['clock'])}")
                    save()
            if args.step_trace:
                captured = next((p for p in [site, *sites.values()] if p and p.state["info"]["decode"] == "captured"),
                                None)
                if captured is None:
                    raise SystemExit("FATAL: --step-trace needs a page decoding captured steps "
                                     "(add the row chromium-webbuild:decode=captured)")
                result["step_trace"] = step_traces(captured, args.step_trace, clocks)
                save()
            if args.timing:  # after the rounds: the timing wrap is off during them
                result["timing_per_token"] = timed_decodes(site, peer, args)
                save()
            if args.first_use:
                lengths = [float(x) for x in args.first_use.split(",")]
                result["first_use"] = {"rows": first_use_step(browser, url, lengths, args)}
                result["first_use"]["markdown"] = first_use_table(result["first_use"]["rows"])
                save()
            pages = [p for p in (site, peer) if p]
            result["console_errors"] = [c for p in pages for c in p.log["console"] if c.startswith("error")][:20]
            result["page_errors"] = [e for p in pages for e in p.log["errors"]][:20]
        finally:
            browser.close()
            httpd.shutdown()

    table_rows = []
    for name in rows:
        rs = [r for r in result["rounds"] if r["row"] == name]
        for r in rs:  # node rounds have no per-step list: their own spread stands in
            r.setdefault("steps", None)
        steps_rows = [{**r, "steps": r["steps"] or []} for r in rs]
        per = next((r.get("per_token") for r in rs if r.get("per_token")), None)
        if name in ("chromium-webbuild", LORA_ROW) or name.startswith("chromium-webbuild:"):
            page = result["sites"][name] if ":" in name else result["site"]
            load, ttft = page["info"]["load"], _median([c.get("ttft_ms") for c in page["clips"]])
        elif name == "chromium-peer":
            load, ttft = result["peer"]["load"], None
        else:
            load, ttft = rs[0]["load"] if rs else None, _median([r.get("ttft_ms") for r in rs])
        row = row_of(name, steps_rows, load, {"ttft_ms": ttft, "clock": gpu_clock.merged([r.get("clock") for r in rs])})
        row["per_token"] = per
        if name.startswith("node"):  # no per-step times came back: p10/p90 are the rounds' own
            row["decode_all_steps"] = {"p10": _median([r["decode"]["p10"] for r in rs]),
                                       "p90": _median([r["decode"]["p90"] for r in rs]),
                                       "median": row["decode_median_of_rounds"], "n": sum(r["decode"]["n"] for r in rs)}
        table_rows.append(row)
    result["table"] = table_rows
    result["markdown"] = md_table(table_rows)
    save()
    print(result["markdown"])
    if "first_use" in result:
        print(result["first_use"]["markdown"])
    return 0


def _median(xs):
    xs = sorted(x for x in xs if x is not None)
    return round(xs[len(xs) // 2], 2) if xs else None


if __name__ == "__main__":
    sys.exit(main())

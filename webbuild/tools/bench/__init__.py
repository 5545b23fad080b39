"""`webbuild bench`: runs a built site's own runtime modules under Node (webbuild/tools/bench/bench.mjs)
and turns its JSON report into a printed table (and a file with --json)."""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import threading
from pathlib import Path

from webbuild.errors import BenchError
from webbuild.text import size

log = logging.getLogger(__name__)
HARNESSES = Path(__file__).resolve().parent  # the Node harnesses ship beside this module
# Flags for every Node the bench starts (shell-style quoting), as $WEBBUILD_BROWSER_ARGS is for Chromium.
# The tests set --liftoff-only: V8's optimising wasm compiler otherwise spends about 50 s of CPU on
# onnxruntime-web's 25 MB module in every run on a 2-core machine; figures measured so are not a benchmark's.
NODE_ARGS_ENV = "WEBBUILD_NODE_ARGS"
# Chromium's software Vulkan driver: WebGPU without a GPU (correct, not fast).
SWIFTSHADER_ENV = {
    "LD_LIBRARY_PATH": "/usr/lib/chromium",
    "VK_ICD_FILENAMES": "/usr/lib/chromium/vk_swiftshader_icd.json",
}


# the load's warm-up (--warm-up): every shape class, all but the longest chunk's, a second of silence
WARM_UPS = ("shapes", "decode", "second")
# the decode forms a Node run of a built site measures (--decode-forms): the one its load chooses; or the captured
# form, then plain steps on the same load (one load instead of two: most of a software GPU's run)
DECODE_FORMS = ("auto", "both")
# the terminal table's line that begins the plain steps' figures of a --decode-forms both run
PLAIN_SECTION = "plain steps"
PROGRESS = "[bench] "  # how the harnesses' progress lines on stderr begin (the report alone is on stdout)
# merged decoders benched as peers: the onnxruntime-genai builder's, optimum's
MERGED_NAMES = ("model.onnx", "decoder_model_merged.onnx")


def run_node(
    dist: Path,
    ep: str = "auto",
    decode_tokens: int = 128,
    repeat: int = 1,
    max_clips: int | None = None,
    swiftshader: bool = False,
    timeout: float | None = None,
    session_config: dict[str, str] | None = None,
    graph_capture: bool = True,
    max_new_tokens: int | None = None,
    adapter: str | None = None,
    warm_up: str = "shapes",
    decode_forms: str = "auto",
) -> dict:
    """Runs the Node harness on `dist` and returns its report.

    A built site runs through its own runtime (bench.mjs); a split source export (the baseline,
    which the site runtime does not take) through split.mjs, and a merged decoder (a peer such as
    the onnxruntime-genai builder's graph) through merged.mjs, both on synthetic inputs of the
    site's shapes. `adapter`: a built site's LoRA adapter switched on (on, off and on again, each
    switch's WebGPU calls counted) before the clips and the synthetic decode run with it. `warm_up` (WARM_UPS):
    every shape class, all but the longest chunk's (its encoder run and prompt, the bulk of a software GPU's
    load), or a second of silence. `decode_forms` (DECODE_FORMS) "both": a built site's clips and synthetic decode
    in the captured form, then in plain steps, on one load (the report's `plain`: the plain steps' figures).
    """
    _check_inputs(dist)
    if (dist / "model" / "manifest.json").is_file():
        harness, extra = HARNESSES / "bench.mjs", ["--repeat", str(repeat)]
        if max_clips is not None:
            extra += ["--max-clips", str(max_clips)]
        if max_new_tokens is not None:
            extra += ["--max-new-tokens", str(max_new_tokens)]
        extra += ["--graph-capture", str(int(graph_capture)), "--warm-up", warm_up, "--decode-forms", decode_forms]
        if adapter:
            extra += ["--adapter", adapter]
    elif decode_forms != "auto":
        raise BenchError(f"{dist}: --decode-forms {decode_forms} is for a built site, whose runtime decodes in either "
                         "form; a split export or a merged decoder runs its graphs one way")
    elif (dist / "decoder_init.onnx").is_file():
        harness, extra = HARNESSES / "split.mjs", []
    elif merged := next((n for n in MERGED_NAMES if (dist / n).is_file()), None):
        harness, extra = HARNESSES / "merged.mjs", ["--model", merged]
    else:
        raise BenchError(f"{dist}: not a built site (no model/manifest.json), a split export (no decoder_init.onnx) "
                         f"nor a merged decoder ({' or '.join(MERGED_NAMES)}); "
                         f"build it with `webbuild model.yaml -o {dist}`")
    node = os.environ.get("WEBBUILD_NODE") or shutil.which("node")
    if not node:
        raise BenchError("node not found: install Node >= 20 or set WEBBUILD_NODE")
    for key, value in (session_config or {}).items():
        extra += ["--session-config", f"{key}={value}"]
    cmd = [node, *node_args(), str(harness), str(dist), "--ep", ep, "--decode-tokens", str(decode_tokens), *extra]
    env = {**os.environ, **(SWIFTSHADER_ENV if swiftshader else {})}
    try:
        returncode, stdout, stderr = _run_telling_progress(cmd, env, timeout)
    except FileNotFoundError:
        raise BenchError(f"node {node!r} not found: install Node >= 20 or set WEBBUILD_NODE") from None
    if returncode != 0:
        # a thrown Error's own line (its stack follows it), else the last lines
        thrown = [line for line in stderr if re.match(r"\w*Error: ", line)]
        tail = thrown[-1:] or [line for line in stderr if line.strip()][-5:]
        raise BenchError(f"{harness.name} failed: " + (" | ".join(tail) or f"exit code {returncode}"))
    report = json.loads(stdout.strip().splitlines()[-1])
    if harness.name == "bench.mjs" and report.get("variant"):
        report["wasm_estimate_bytes"] = wasm_estimate(dist, report["variant"])
    return report


def require_adapter(names: list[str], name: str) -> None:
    """A clear error where adapter `name` is not among the site's `names`."""
    if name not in names:
        has = ", ".join(names) or "none (model.yaml adapters: adds them)"
        raise BenchError(f"no adapter {name!r}; the site has {has}")


def site_adapters(dist: Path) -> list[str] | None:
    """The adapters a built site ships (its manifest), or None where its manifest cannot be read (the load says why)."""
    from webbuild.errors import SourceError
    from webbuild.site.manifest import load_manifest

    try:
        return list(load_manifest(dist / "model").get("adapters") or {})
    except SourceError:
        return None


def wasm_estimate(dist: Path, variant: str, key: str = "need_bytes") -> int | None:
    """The build's estimate of the wasm memory `variant` needs (build-report.json, pipeline/wasm_budget.py): the
    heap's (need_bytes) or the tab's (tab_bytes)."""
    try:
        report = json.loads((dist / "build-report.json").read_text())
    except (OSError, ValueError):
        return None
    return ((report.get("variants") or {}).get(variant) or {}).get("wasm", {}).get(key)


def _run_telling_progress(cmd: list[str], env: dict, timeout: float | None) -> tuple[int, str, list[str]]:
    """Run a harness; its `[bench] ...` progress lines on stderr are logged as they come (a bench runs for
    minutes), the rest kept for the error. Returns (exit code, stdout, stderr's lines); past `timeout`
    seconds the harness is killed and subprocess.TimeoutExpired raised, as subprocess.run does."""
    stderr: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as proc:
        def follow() -> None:
            for line in proc.stderr:  # type: ignore[union-attr]  # stderr=PIPE
                stderr.append(line.rstrip("\n"))
                if line.startswith(PROGRESS):
                    log.info(line[len(PROGRESS):].rstrip())

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        expired = threading.Event()

        def kill() -> None:
            expired.set()
            proc.kill()

        killer = threading.Timer(timeout, kill) if timeout else None
        if killer:
            killer.start()
        try:
            stdout = proc.stdout.read()  # type: ignore[union-attr]  # stdout=PIPE; the report, at the end
            proc.wait()
        finally:
            if killer:
                killer.cancel()
        reader.join()
    if expired.is_set():
        raise subprocess.TimeoutExpired(cmd, timeout or 0)
    return proc.returncode, stdout, stderr


def _check_inputs(dist: Path) -> None:
    """What the harness reads, checked here, so that a damaged site or source is one line naming the file
    rather than a Node stack trace: a site's manifest and shards (sha256, as the page checks them), a
    source export's files (webbuild.reference.source_files)."""
    from webbuild import layouts
    from webbuild.reference.source_files import check_source
    from webbuild.site.manifest import check_shards, load_manifest

    if (dist / "model" / "manifest.json").is_file():
        check_shards(dist / "model", load_manifest(dist / "model"))
    elif (found := layouts.detect(dist)) is not None:
        check_source(dist, found)


def node_args() -> list[str]:
    return shlex.split(os.environ.get(NODE_ARGS_ENV, ""))


def table(r: dict) -> str:
    """The report as aligned lines for the terminal; a --decode-forms both run's plain steps after its own form."""
    load = r["load"]
    parts = ", ".join(f"{k.removesuffix('_ms')} {v:.0f}" for k, v in load.items() if k != "total_ms")
    runtime = ("node " + r["node"]) if "node" in r else r["browser"]
    lines = [
        f"runtime     {runtime}, ep {r['ep']}, variant {r['variant']}, "
        f"threads {r['threads']}, kv cache {r['kv_cache']}" + (f", decode {r['decode']}" if r.get("decode") else ""),
        f"gpu         {r['gpu']}" + (" (shader-f16)" if r.get("shader_f16") else ""),
        f"load        {load['total_ms']:.0f} ms ({parts})",
        *form_lines(r),
        *lora_lines(r),
    ]
    if r.get("gpu_clock"):
        from webbuild.tools.bench.gpu_clock import describe

        lines.append(f"gpu clock   {describe(r['gpu_clock'])} (nvidia-smi every 50 ms, over the whole bench)")
    if heap := r.get("wasm_heap_bytes", {}).get("peak"):
        estimate = f"; the build's estimate {size(r['wasm_estimate_bytes'])}" if r.get("wasm_estimate_bytes") else ""
        lines.append(f"wasm heap   {size(r['wasm_heap_bytes']['loaded'])} after loading, {size(heap)} at the end"
                     + estimate)
    if tab := r.get("tab_peak_rss_bytes"):
        now = f", {size(r['tab_rss_bytes'])} at the end" if r.get("tab_rss_bytes") else ""
        now += f", {size(r['tab_rss_after_gc_bytes'])} after gc()" if r.get("tab_rss_after_gc_bytes") else ""
        now += f"; the build's estimate {size(r['tab_estimate_bytes'])}" if r.get("tab_estimate_bytes") else ""
        lines.append(f"tab memory  {size(tab)} at most{now} (the renderer process's resident memory)")
    return "\n".join(lines + counter_lines(r) + timing_lines(r) + plain_lines(r))


def form_lines(r: dict) -> list[str]:
    """What one decode form gave: the clips' encoder, TTFT, prefill and decode, or the synthetic decode's."""
    s = r["summary"]
    synth = r.get("synthetic_decode")
    dec = synth["ms_per_token"] if synth else s["decode_ms_per_token_clips"]
    lines = [
        f"encoder     {_ms(s['encoder_ms'])}"
        + (f" (median over {s['clips']} clips)" if "clips" in s else " (synthetic input)"),
        f"TTFT        {_ms(s['ttft_ms'])}",
        f"prefill     {_num(s['prefill_tokens_per_s'])} tok/s "
        f"({_num(s['prompt_tokens'], 0)} prompt tokens in {_ms(s['prefill_ms'])})",
        f"decode      {_num(dec['median'])} ms/token median, p10 {_num(dec['p10'])}, p90 {_num(dec['p90'])} "
        + (f"({dec['n']} synthetic tokens)" if synth else f"(over {dec['n']} clips)"),
    ]
    if "clips" in s:
        lines.append(f"clips       {s['clips_matching']}/{s['clips']} transcripts equal the expected text")
    return lines


def plain_lines(r: dict) -> list[str]:
    """--decode-forms both: the plain steps' figures (the report's `plain`), on the same load as those above."""
    if not (plain := r.get("plain")):
        return []
    form = {**r, **plain}
    return [f"{PLAIN_SECTION} the clips and the synthetic decode again on the same load, every decode step a plain "
            f"run of the decoder (decode {plain['decode']}):",
            *form_lines(form), *counter_lines(form), *timing_lines(form)]


def lora_lines(r: dict) -> list[str]:
    """The LoRA adapter on, with what switching it on, off and on again took (bench.mjs --adapter; the browser
    bench picks it in the page, untimed)."""
    if not r.get("lora"):
        return []
    if "lora_switches" not in r:
        return [f"lora        {r['lora']} (picked in the page)"]
    steps = []
    for s in r["lora_switches"]:
        c = s["counts"]
        calls = (f": {_count(c['buffers'])} buffers, {_count(c['write_buffers'])} writeBuffer "
                 f"({size(c['write_bytes'])})") if c else ""
        steps.append(f"{'on' if s['to'] else 'off'} {s['ms']:.0f} ms{calls}")
    return [f"lora        {r['lora']} (switched {'; '.join(steps)})"]


def counter_lines(r: dict) -> list[str]:
    """WebGPU calls per decode token (webbuild/tools/bench/counters.mjs), or why there are none."""
    c = r.get("counters_per_token")
    if not c:
        why = ("the wasm EP makes no WebGPU calls" if r["ep"] != "webgpu"
               else "not counted by this runtime" if "counters_per_token" not in r
               else "not counted: fewer than 2 decode tokens")
        return [f"per token   - ({why})"]
    short, long = c["decode_tokens"]
    top = ", ".join(f"{k} {_count(v)}" for k, v in list(c["kernels"].items())[:12])
    more = len(c["kernels"]) - 12
    return [
        f"per token   {_count(c['dispatches'])} dispatches ({_count(c.get('indirect', 0))} indirect), "
        f"{_count(c['submits'])} submits, {_count(c['readbacks'])} "
        f"read-backs, {_count(c['write_buffers'])} writeBuffer ({_count(c['write_bytes'])} B), "
        f"{_count(c['bind_groups'])} bind groups, {_count(c['buffers'])} buffers ({long} - {short} token decodes)",
        f"kernels     {top}" + (f" (+{more} more in the JSON)" if more > 0 else ""),
    ]


def timing_lines(r: dict) -> list[str]:
    """Where a decode token's time goes (webbuild/tools/bench/timing.mjs), or why it is not cut up."""
    t = r.get("timing_per_token")
    if not t:
        why = ("the wasm EP has no WebGPU read-back to cut at" if r["ep"] != "webgpu"
               else "not timed by this runtime" if "timing_per_token" not in r else "no decode step")
        return [f"time/token  - ({why})"]
    calls = t["webgpu_calls"] * t["wrapper_us_per_call"] / 1000
    issue = (f"issue {t['issue_cpu_ms']:.2f} (in {t['webgpu_calls']:g} WebGPU calls {t['webgpu_call_ms']:.2f}, "
             f"timing them {calls:.3f})")
    if t.get("pipelined"):  # steps queued ahead of the tokens: the other phases overlap
        lines = [f"time/token  {t['wall_ms']:.2f} ms, of which {issue} to queue a step; the steps are queued "
                 f"ahead of the tokens read (means over {t['steps']} steps)"]
    else:
        lines = [f"time/token  {t['wall_ms']:.2f} ms = pre {t['pre_ms']:.2f} + {issue} + read-back wait "
                 f"{t['readback_wait_ms']:.2f} + post {t['post_ms']:.2f} (means over {t['steps']} steps)"]
    if "gpu_ms" not in t:
        return lines + [f"gpu kernels - ({t['gpu_timing']})"]
    top = ", ".join(f"{k} {v:.3f}" for k, v in list(t["kernels_gpu_ms"].items())[:8])
    more = len(t["kernels_gpu_ms"]) - 8
    return lines + [
        f"gpu         {t['gpu_ms']:.2f} ms busy per token ({t['gpu_timing']}, a separate decode at "
        f"{t['gpu_timed_wall_ms']:.2f} ms/token): {t['bound']} bound",
        f"gpu kernels {top} ms" + (f" (+{more} more in the JSON)" if more > 0 else ""),
    ]


def _count(v: float) -> str:
    return f"{v:g}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f} ms"


def _num(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"

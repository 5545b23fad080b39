#!/usr/bin/env python3
"""Start Chromium headless with a set of GPU flags and ask it what WebGPU adapter it offers (issue 15).

Standard library only (the GPU machine has python3 but no Node, no Playwright): Chromium is driven
over the DevTools protocol on a pipe (--remote-debugging-pipe: NUL-terminated JSON on fds 3 and 4),
the probe page is served from this folder by a local http.server (a secure context), and for each
named configuration the result is one JSON object: the browser's own GPU report
(SystemInfo.getInfo: feature status, GL renderer, driver bug workarounds), what
chrome_gpu_probe.html's runProbe() measured, and the GPU-related lines of Chromium's log.

  python3 chrome_gpu_probe.py --chrome /tmp/chrome/chromium --configs sw,vulkan --out DIR
"""
import argparse
import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

COMMON = [
    "--headless", "--no-sandbox", "--no-first-run", "--no-default-browser-check",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--mute-audio",
    "--enable-unsafe-webgpu", "--ignore-gpu-blocklist",
    "--enable-logging=stderr", "--v=0",
    "--vmodule=gpu_init=2,gpu_info_collector*=2,webgpu_decoder_impl=2,vulkan*=2,dawn*=2,gl_display*=1,"
    "gpu_data_manager*=1,gpu_process_host*=1,shared_context_state=1",
]

# name -> extra flags. 'sw' is the SwiftShader reference; the others try to put WebGPU on the GPU.
# WebGPU's default adapter on Linux is Vulkan only when Skia itself runs on Vulkan (GrContextIsVulkan:
# --enable-features=Vulkan), the GL under it must not be SwiftShader (else the WebGPU feature status
# is "software" and every request is forced to the fallback adapter), and headless ozone needs
# --disable-vulkan-surface unless the driver has VK_EXT_headless_surface.
CONFIGS = {
    "sw": ["--use-angle=swiftshader", "--use-webgpu-adapter=swiftshader", "--enable-unsafe-swiftshader"],
    "vk_angle": ["--use-angle=vulkan", "--enable-features=Vulkan,VulkanFromANGLE,DefaultANGLEVulkan",
                 "--use-vulkan=native", "--disable-vulkan-surface"],
    "vk_angle_plain": ["--use-angle=vulkan", "--enable-features=Vulkan", "--use-vulkan=native",
                       "--disable-vulkan-surface"],
    "egl_vk": ["--use-gl=angle", "--use-angle=gl-egl", "--enable-features=Vulkan", "--use-vulkan=native",
               "--disable-vulkan-surface"],
    "gles_vk": ["--use-gl=angle", "--use-angle=gles-egl", "--enable-features=Vulkan", "--use-vulkan=native",
                "--disable-vulkan-surface"],
    "egl_gl": ["--use-gl=angle", "--use-angle=gl-egl"],
    "egl_gles_webgpu": ["--use-gl=angle", "--use-angle=gl-egl", "--use-webgpu-adapter=opengles"],
    "graphite": ["--use-angle=vulkan", "--enable-skia-graphite", "--enable-features=SkiaGraphite"],
    "sw_vk": ["--use-angle=swiftshader", "--enable-unsafe-swiftshader", "--enable-features=Vulkan",
              "--use-vulkan=native", "--disable-vulkan-surface"],
    "default": [],
}

LOG_KEEP = re.compile(r"webgpu|dawn|vulkan|angle|egl|gpu_init|swiftshader|gpu process|GpuProcess|"
                      r"drm|adapter|ICD|vkCreate|Passthrough|gl_implementation|GL_RENDERER|blocklist|"
                      r"crash|FATAL|exit code|Check failed", re.I)


class Pipe:
    """DevTools protocol over --remote-debugging-pipe."""

    def __init__(self, proc, wfd, rfd):
        self.proc, self.w, self.r = proc, wfd, rfd
        self.next_id = 0
        self.pending = {}
        self.events = []
        self.lock = threading.Lock()
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self):
        buf = b""
        while True:
            try:
                chunk = os.read(self.r, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
            while b"\0" in buf:
                msg, buf = buf.split(b"\0", 1)
                m = json.loads(msg)
                if "id" in m:
                    with self.lock:
                        slot = self.pending.get(m["id"])
                    if slot is not None:
                        slot.append(m)
                        slot_event = slot[0]
                        slot_event.set()
                else:
                    self.events.append(m)
        with self.lock:
            for slot in self.pending.values():
                slot[0].set()

    def call(self, method, params=None, session=None, timeout=30):
        with self.lock:
            self.next_id += 1
            i = self.next_id
            ev = threading.Event()
            self.pending[i] = [ev]
        msg = {"id": i, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        if not ev.wait(timeout):
            raise TimeoutError(f"{method}: no answer in {timeout} s")
        with self.lock:
            slot = self.pending.pop(i)
        if len(slot) < 2:
            raise RuntimeError(f"{method}: browser went away")
        if "error" in slot[1]:
            raise RuntimeError(f"{method}: {slot[1]['error']}")
        return slot[1].get("result", {})


def serve(folder):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a):
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def launch(chrome, flags, log_path, profile):
    a_r, a_w = os.pipe()  # we write commands to a_w, Chromium reads fd 3
    b_r, b_w = os.pipe()  # Chromium writes fd 4, we read b_r

    def fds():
        os.dup2(a_r, 100)
        os.dup2(b_w, 101)
        os.dup2(100, 3)
        os.dup2(101, 4)

    cmd = [chrome, *COMMON, *flags, f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"]
    with open(log_path, "wb") as log:  # Chromium writes to its own copy of the descriptor
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=fds, close_fds=False, start_new_session=True)
    os.close(a_r)
    os.close(b_w)
    return proc, Pipe(proc, a_w, b_r), cmd


def run_config(name, flags, args, url, outdir):
    log_path = outdir / f"{name}.log"
    profile = tempfile.mkdtemp(prefix=f"chrome-{name}-")
    res = {"config": name, "flags": flags}
    t0 = time.time()
    proc, cdp, cmd = launch(args.chrome, flags, log_path, profile)
    res["command"] = " ".join(cmd)
    try:
        cdp.call("Browser.getVersion", timeout=30)
        # Wait for the GPU process before the page asks for an adapter: a requestAdapter() made while it
        # still starts gets null ("ContextResult::kTransientFailure: Failed to send
        # GpuControl.CreateCommandBuffer", then "A valid external Instance reference no longer exists").
        t_gpu = time.time()
        try:
            cdp.call("SystemInfo.getInfo", timeout=30)
        except Exception as e:  # noqa: BLE001
            res["gpu_wait_error"] = str(e)
        res["gpu_wait_s"] = round(time.time() - t_gpu, 2)
        target = cdp.call("Target.createTarget", {"url": url})["targetId"]
        session = cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        deadline = time.time() + 30
        while time.time() < deadline:
            r = cdp.call("Runtime.evaluate", {"expression": "document.getElementById('out')?.textContent",
                                              "returnByValue": True}, session=session)
            if r.get("result", {}).get("value") == "ready":
                break
            time.sleep(0.2)
        if args.page == "ort":
            expr = f"runOrt({args.ort_opts})"
        else:
            opts = json.loads(args.probe_opts)
            if name.startswith("sw"):
                opts = {**opts, **json.loads(args.sw_probe_opts)}
            expr = f"runProbe({json.dumps(opts)})"
        r = cdp.call("Runtime.evaluate", {"expression": expr, "awaitPromise": True, "returnByValue": True},
                     session=session, timeout=args.probe_timeout)
        res["probe"] = r.get("result", {}).get("value", r)
        try:
            info = cdp.call("SystemInfo.getInfo", timeout=20)
            gpu = info.get("gpu", {})
            aux = gpu.get("auxAttributes", {})
            res["gpu"] = {
                "featureStatus": gpu.get("featureStatus"),
                "driverBugWorkarounds": gpu.get("driverBugWorkarounds"),
                "devices": gpu.get("devices"),
                "aux": {k: aux.get(k) for k in ("glRenderer", "glVendor", "glVersion", "glImplementationParts",
                                                  "displayType", "passthroughCmdDecoder", "sandboxed",
                                                  "inProcessGpu", "targetCpuBits", "visibilityCallbackCalled")
                        if k in aux},
            }
        except Exception as e:  # noqa: BLE001 - a report without it still says what the page saw
            res["gpu_error"] = str(e)
    except Exception as e:  # noqa: BLE001
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        with contextlib.suppress(Exception):
            cdp.call("Browser.close", timeout=5)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)
    res["seconds"] = round(time.time() - t0, 1)
    res["exit_code"] = proc.returncode
    lines = log_path.read_text(errors="replace").splitlines()
    res["log_lines"] = len(lines)
    res["log"] = [ln[:400] for ln in lines if LOG_KEEP.search(ln)][:120]
    return res


def summary(res):
    p = res.get("probe") or {}
    if "ort" in p:
        def ep(e):
            x = p.get(e) or {}
            rs = x.get("rounds") or []
            return ", ".join(f"{e}: load {x.get('load_ms')} ms enc {r['encoder_ms']} prefill {r['prefill_ms']} "
                             f"step {r['step_ms_median']} ms ({r['tokens_per_s']} tok/s) per-step {r['per_step']}"
                             for r in rs)
        return (f"{res['config']:>15}: adapter={p.get('adapter')} {ep('webgpu')} | {ep('wasm')} "
                f"tokens_equal={p.get('tokens_equal')} first_diff={p.get('first_diff')} "
                f"{'ERROR ' + res['error'] if 'error' in res else ''} errs={p.get('errors')}")
    a = (p.get("adapters") or {}).get("highPerformance") or {}
    info = a.get("info") or {}
    mm = p.get("matmul") or {}
    tiny = p.get("tiny") or {}
    fs = ((res.get("gpu") or {}).get("featureStatus") or {})
    gl = ((res.get("gpu") or {}).get("aux") or {}).get("glRenderer")
    return (f"{res['config']:>15}: adapter={info.get('vendor')!r}/{info.get('architecture')!r}/"
            f"{info.get('description')!r} fallback={info.get('isFallbackAdapter', a.get('isFallbackAdapter'))} "
            f"f16={'shader-f16' in (a.get('features') or [])} matmul_med={mm.get('median_ms')}ms "
            f"batched={mm.get('batched_ms_per_dispatch')}ms err={mm.get('max_abs_err')} "
            f"tiny={tiny.get('us_per_dispatch_batched')}us rt={tiny.get('submit_roundtrip_ms_median')}ms "
            f"webgpu={fs.get('webgpu')} vulkan={fs.get('vulkan')} gl={gl!r} "
            f"{'ERROR ' + res['error'] if 'error' in res else ''} errs={p.get('errors')}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chrome", required=True)
    ap.add_argument("--configs", default="sw,vk_angle")
    ap.add_argument("--extra", default="", help="flags added to every configuration, space-separated")
    ap.add_argument("--out", default="chrome-gpu-out")
    ap.add_argument("--probe-opts", default='{"n": 1024, "reps": 30, "budgetMs": 20000}')
    ap.add_argument("--sw-probe-opts", default='{"reps": 5, "warmup": 1, "batch": 2, "tinyBatch": 200, "tinyReps": 20}')
    ap.add_argument("--probe-timeout", type=float, default=90)
    ap.add_argument("--page", choices=["probe", "ort"], default="probe")
    ap.add_argument("--root",
                    help="folder to serve (default: this one); the ort page wants the ORT files and model/ in it")
    ap.add_argument("--ort-opts", default='{"decodeTokens": 64, "rounds": 2}')
    args = ap.parse_args()
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    httpd = serve(Path(args.root) if args.root else HERE)
    page = "chrome_gpu_ort.html" if args.page == "ort" else "chrome_gpu_probe.html"
    url = f"http://127.0.0.1:{httpd.server_address[1]}/{page}"
    results = []
    for spec in args.configs.split(","):
        name, _, more = spec.partition("+")  # e.g. vk_angle+--foo=bar+--baz
        flags = CONFIGS[name] + [f for f in more.split("+") if f] + args.extra.split()
        if not name.startswith("sw"):
            flags.append("--enable-gpu")  # headless mode picks SwiftShader GL unless told otherwise
        res = run_config(spec.replace("+", "_").replace("--", "").replace("=", "-")[:60], flags, args, url, outdir)
        results.append(res)
        print(summary(res), flush=True)
        (outdir / "results.json").write_text(json.dumps(results, indent=1))
    httpd.shutdown()


if __name__ == "__main__":
    sys.exit(main())

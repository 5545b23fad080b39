"""Which Chrome/Chromium to drive, with which flags, and small page helpers shared by the tests.

Selection order: an explicit path or channel (argument, else $WEBBUILD_BROWSER), else a system
Chrome/Chromium on PATH, else Playwright's own download. Without a GPU, WebGPU runs on SwiftShader
(Chrome's software Vulkan), which needs the unsafe flags below. $WEBBUILD_BROWSER_ARGS adds Chromium
flags to every launch (shell-style quoting), e.g. the ones that put WebGPU on a headless machine's
GPU (docs/gpu-machine.md).
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from webbuild.errors import BrowserError

ENV = "WEBBUILD_BROWSER"
ARGS_ENV = "WEBBUILD_BROWSER_ARGS"
CHANNELS = {"chrome", "chrome-beta", "chrome-dev", "chrome-canary", "msedge", "chromium"}
SYSTEM = ("google-chrome", "google-chrome-stable", "chromium", "chromium-browser", "/usr/bin/chromium")
QUIET = ["--no-sandbox", "--disable-background-networking", "--disable-component-update"]
WEBGPU = ["--enable-unsafe-webgpu"]
SWIFTSHADER = ["--enable-unsafe-swiftshader", "--use-webgpu-adapter=swiftshader"]
# A browser without WebGPU, emulated in the page and in the site's worker: no Chromium 156 switch
# takes WebGPU away where the GPU offers it (--disable-blink-features=WebGPU, --disable-gpu and
# --disable-features=WebGPUService all leave navigator.gpu and an adapter on the H200 and on
# SwiftShader), so launching without the WebGPU flags is not enough on a real GPU.
HIDE_WEBGPU = ("Object.defineProperty(Object.getPrototypeOf(navigator), 'gpu', "
               "{ get() { return undefined; }, configurable: true });\n")
WORKER = "**/worker.js"  # the site's worker entry (app.js), where the runtime asks for an adapter


@dataclass
class BrowserChoice:
    """Keyword arguments for playwright's chromium.launch (minus args) and how they were found."""

    executable: str | None = None
    channel: str | None = None
    source: str = "playwright"  # explicit | env | system | playwright
    gpu: bool = False
    args: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)  # $WEBBUILD_BROWSER_ARGS, added to every launch

    def describe(self) -> str:
        what = self.executable or (f"channel {self.channel}" if self.channel else "Playwright's Chromium")
        flags = f"; {ARGS_ENV}: {shlex.join(self.extra)}" if self.extra else ""
        return f"{what} ({self.source}; {'GPU' if self.gpu else 'no GPU: SwiftShader WebGPU'}{flags})"


def has_gpu() -> bool:
    """A GPU the browser can use: a DRM render node or an NVIDIA device node."""
    return bool(glob.glob("/dev/dri/renderD*") or glob.glob("/dev/nvidia[0-9]*"))


def choose(explicit: str | None = None, env: Mapping[str, str] | None = None, which=shutil.which,
           gpu: bool | None = None) -> BrowserChoice:
    env = os.environ if env is None else env
    gpu = has_gpu() if gpu is None else gpu
    args = QUIET + WEBGPU + ([] if gpu else SWIFTSHADER)
    kw: dict[str, Any] = {"gpu": gpu, "args": args, "extra": shlex.split(env.get(ARGS_ENV, ""))}
    for source, value in (("explicit", explicit), ("env", env.get(ENV))):
        if value:
            if value in CHANNELS:
                return BrowserChoice(channel=value, source=source, **kw)
            if not Path(value).is_file():
                raise BrowserError(f"browser {value!r} ({source}) is neither a file nor one of the "
                                        f"channels {', '.join(sorted(CHANNELS))}")
            return BrowserChoice(executable=str(value), source=source, **kw)
    for name in SYSTEM:
        if path := which(name):
            return BrowserChoice(executable=path, source="system", **kw)
    return BrowserChoice(source="playwright", **kw)


def launch_args(choice: BrowserChoice, webgpu: bool = True, extra: Sequence[str] = ()) -> list[str]:
    """Chromium flags for a launch: the choice's (or WebGPU switched off), then $WEBBUILD_BROWSER_ARGS."""
    return [*(choice.args if webgpu else QUIET), *choice.extra, *extra]


def launch(playwright, choice: BrowserChoice, webgpu: bool = True, extra: Sequence[str] = ()):
    """A headless browser; webgpu=False launches it without the WebGPU flags (pair it with
    hide_webgpu on the context: on a real GPU, Chromium offers WebGPU without any flag)."""
    kw = {"executable_path": choice.executable} if choice.executable else {}
    if choice.channel:
        kw["channel"] = choice.channel
    return playwright.chromium.launch(args=launch_args(choice, webgpu, extra), **kw)


def hide_webgpu(context) -> None:
    """Every page and site worker of the context sees a browser without WebGPU (no navigator.gpu)."""
    context.add_init_script(HIDE_WEBGPU)

    def prepend(route):
        response = route.fetch()
        route.fulfill(response=response, body=HIDE_WEBGPU + response.text())

    context.route(WORKER, prepend)


def wait_for_gpu(page) -> dict | None:
    """Chromium's GPU report (DevTools SystemInfo.getInfo), which answers once the GPU process is up.

    A WebGPU requestAdapter() made while the GPU process still starts returns null on a real GPU
    (docs/gpu-machine.md), and the site would then fall back to wasm; open_page waits here first.
    None where the browser cannot say (not Chromium, or no browser-level DevTools session)."""
    browser = page.context.browser
    if browser is None:
        return None
    try:
        cdp = browser.new_browser_cdp_session()
        try:
            return cdp.send("SystemInfo.getInfo")
        finally:
            cdp.detach()
    except Exception:  # noqa: BLE001 - only a wait: a browser without it loads the page all the same
        return None


def watch(page, log: dict | None = None) -> dict:
    """Collects the page's requests (workers' included), console messages and uncaught errors."""
    log = log if log is not None else {"requests": [], "console": [], "errors": []}
    page.on("request", lambda r: log["requests"].append(r.url))
    page.on("console", lambda m: log["console"].append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: log["errors"].append(str(e)))
    return log


def wait_for(page, predicate: str, timeout_s: float):
    # polled from Python: Playwright's wait_for_function evaluates strings, which the CSP forbids
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if evaluate_settled(page, predicate):
            return
        time.sleep(0.25)
    raise TimeoutError(f"{predicate} not true after {timeout_s} s; state {page.evaluate('() => window.webbuild')}")


def evaluate_settled(page, expression: str):
    """page.evaluate, None while the page is navigating: a site served without COOP/COEP headers reloads its first
    visit once, under its isolation service worker (app/isolation.js)."""
    try:
        return page.evaluate(expression)
    except Exception as exc:  # playwright's Error; the driver is an optional extra, not imported here
        if "Execution context was destroyed" in str(exc):
            return None
        raise


def open_page(page, url: str, timeout_s: float = 400):
    """Load the site and wait until its model is ready (or failed)."""
    wait_for_gpu(page)
    page.goto(url)
    wait_for(page, "() => ['ready', 'error'].includes(window.webbuild?.status)", timeout_s)


def open_site(playwright, srv, query: str, webgpu: bool, choice: BrowserChoice | None = None, **context_options):
    """(browser, page, log) with the page loaded and its model ready (or failed).

    webgpu=False: a browser without WebGPU (launched without its flags, navigator.gpu hidden); context_options:
    Playwright's new_context options (viewport, accept_downloads)."""
    choice = choice or choose()
    browser = launch(playwright, choice, webgpu)
    context = browser.new_context(**context_options)
    if not webgpu:
        hide_webgpu(context)
    page = context.new_page()
    log = watch(page)
    open_page(page, srv.url + query)
    return browser, page, log

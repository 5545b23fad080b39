"""Screenshots of a built site for the README: loading (download progress), preparing (the step without a
fraction: its bar moves), idle (ready), transcript (the clip's player, copy and downloads), phone.

    python docs/screenshots.py dist [--out docs/screenshots] [--webgpu]

The site is served with `webbuild serve`'s server on loopback and driven in headless Chromium;
the download is throttled so that the progress bar can be caught mid-way.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

from webbuild.tools.serve import start

ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update"]
WEBGPU = ["--enable-unsafe-webgpu", "--enable-unsafe-swiftshader", "--use-webgpu-adapter=swiftshader"]


def wait_for(page, predicate: str, timeout_s: float = 300, every: float = 0.25) -> None:
    end = time.monotonic() + timeout_s
    while not page.evaluate(predicate):
        if time.monotonic() > end:
            raise TimeoutError(predicate)
        time.sleep(every)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dist", type=Path)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "screenshots")
    ap.add_argument("--webgpu", action="store_true", help="SwiftShader WebGPU instead of the wasm EP")
    ap.add_argument("--sample", default="#sample-0")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    srv = start(args.dist, quiet=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS + (WEBGPU if args.webgpu else []))
        page = browser.new_page(viewport={"width": 900, "height": 900}, device_scale_factor=1)
        cdp = page.context.new_cdp_session(page)
        cdp.send("Network.emulateNetworkConditions", {"offline": False, "latency": 20,
                                                      "downloadThroughput": 8 * 2**20, "uploadThroughput": 2**20})
        page.goto(srv.url + ("" if args.webgpu else "?ep=wasm"))
        wait_for(page, "() => { const p = window.webbuild?.progress; "
                       "return p && p.phase === 'download' && p.loaded > 0.3 * p.total; }", every=0.05)
        page.screenshot(path=args.out / "loading.png", full_page=True)
        wait_for(page, "() => window.webbuild.progress?.phase === 'session'", every=0.05)
        page.screenshot(path=args.out / "preparing.png", full_page=True)
        wait_for(page, "() => window.webbuild.status === 'ready'")
        page.screenshot(path=args.out / "idle.png", full_page=True)
        page.click(args.sample)
        wait_for(page, "() => window.webbuild.status === 'done'")
        page.screenshot(path=args.out / "transcript.png", full_page=True)
        page.set_viewport_size({"width": 390, "height": 844})
        page.screenshot(path=args.out / "phone.png", full_page=True)
        browser.close()
    srv.shutdown()
    print(f"wrote {', '.join(str(p) for p in sorted(args.out.glob('*.png')))}")


if __name__ == "__main__":
    main()

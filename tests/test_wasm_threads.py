"""The wasm EP's threads on every host: the example served as GitHub Pages serves a site (`webbuild serve
--no-isolation-headers`: no COOP/COEP) is made cross-origin isolated by the site's own service worker after one
reload, and runs more than one thread with the Python reference's tokens; a build without that worker, or a
worker that cannot isolate the page, runs 1 thread and the page says why, without a reload loop; the host's
headers isolate the page without the worker; the bench runs the thread count asked for. In Chromium (real
service workers, real onnxruntime-web threads)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.command import webbuild
from tests.conftest import built_once
from tests.example_config import example_config, write_example_config
from webbuild.site.contract import ISOLATION_WORKER, SAMPLES_FILE
from webbuild.tools.browser import choose, hide_webgpu, launch, open_page, wait_for, watch
from webbuild.tools.serve import start
from webbuild.tools.verify.visits import DONE, Clip, Reference

NOT_ISOLATED = "not cross-origin isolated: the host sends no COOP/COEP headers and "


@pytest.fixture(scope="module")
def browser(playwright):
    browser = launch(playwright, choose(), webgpu=False)
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def example_dist_without_isolation_worker(tmp_path_factory):
    """The example built with model.yaml site.isolation_worker: false, once a test run; read-only."""
    site = example_config()["site"] | {"isolation_worker": False}
    return built_once(tmp_path_factory, "example-without-isolation-worker",
                      lambda folder: (write_example_config(folder, site=site),)).dist


def serve(dist, isolation_headers: bool = False):
    return start(dist, quiet=True, isolation_headers=isolation_headers)


def visit(browser, url: str):
    """A fresh profile without WebGPU (the CPU path) opening `url` until its model is ready: (page, its
    navigations, its console and requests)."""
    context = browser.new_context()
    hide_webgpu(context)
    page = context.new_page()
    log = watch(page)
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url) if frame == page.main_frame else None)
    open_page(page, url, 300)
    return page, navigations, log


def ready_info(page) -> dict:
    state = page.evaluate("() => window.webbuild")
    assert state["status"] == "ready", state
    return state["info"]


def test_a_site_without_isolation_headers_is_isolated_by_its_service_worker(browser, example_dist):
    srv = serve(example_dist)
    try:
        page, navigations, log = visit(browser, srv.url)
        assert page.evaluate("() => crossOriginIsolated") is True
        assert navigations == [srv.url, srv.url]  # registered, then one reload under the worker's control
        info = ready_info(page)
        cores = page.evaluate("() => navigator.hardwareConcurrency")
        assert info["ep"] == "wasm" and info["threads"] >= 2, info  # 2 logical processors give 2 threads
        assert info["threadsWhy"] == f"{cores} logical processors"
        assert page.inner_text("#m-runtime").startswith(
            f"WebAssembly, {info['threads']} threads ({cores} logical processors; "
            "cross-origin isolated: by the site's service worker) · fp32")
        # a sample transcribed on those threads: the Python reference's tokens exactly
        sample = json.loads((example_dist / SAMPLES_FILE).read_text())["samples"][0]
        page.click(f"#{sample['id']}")
        wait_for(page, DONE, 300)
        state = page.evaluate("() => window.webbuild")
        ref = Reference(example_dist).transcribe(Clip(sample["id"], sample["text"], local=example_dist / sample["src"]),
                                                 "fp32")
        assert ref is not None and state["tokens"] == [ref.tokens] and state["text"] == sample["text"], state
        # the next visit is controlled from its start: no reload
        navigations.clear()
        page.reload()
        wait_for(page, "() => ['ready', 'error'].includes(window.webbuild?.status)", 300)
        assert navigations == [srv.url] and ready_info(page)["threads"] == info["threads"]
        assert not [c for c in log["console"] if c.startswith("error")] and not log["errors"], log
        assert all(u.startswith(srv.url) for u in log["requests"])
        page.context.close()
    finally:
        srv.shutdown()


def test_without_the_service_worker_the_page_runs_one_thread_and_says_why(browser,
                                                                          example_dist_without_isolation_worker):
    dist = example_dist_without_isolation_worker
    assert not (dist / ISOLATION_WORKER).exists()
    assert "webbuild-isolation-worker" not in (dist / "index.html").read_text()
    srv = serve(dist)
    try:
        page, navigations, _ = visit(browser, srv.url)
        assert navigations == [srv.url] and page.evaluate("() => crossOriginIsolated") is False
        info = ready_info(page)
        assert info["threads"] == 1 and info["threadsWhy"] == "not cross-origin isolated"
        assert page.inner_text("#m-runtime").startswith(
            f"WebAssembly, 1 thread ({NOT_ISOLATED}the site's service worker is off (model.yaml "
            "site.isolation_worker)) · fp32")
        assert page.evaluate("async () => (await navigator.serviceWorker.getRegistrations()).length") == 0
        page.context.close()
    finally:
        srv.shutdown()


def test_a_worker_that_does_not_isolate_the_page_costs_one_reload_not_a_loop(browser, example_dist, tmp_path):
    """A service worker that adds no headers (a browser that ignores them would do the same): the page reloads
    once, then runs 1 thread and says the worker did not isolate it."""
    dist = tmp_path / "site"
    shutil.copytree(example_dist, dist, copy_function=os.link)
    (dist / ISOLATION_WORKER).unlink()  # a hard link: the shared build's file stays as it is
    (dist / ISOLATION_WORKER).write_text("self.addEventListener('install', () => self.skipWaiting());\n")
    srv = serve(dist)
    try:
        page, navigations, _ = visit(browser, srv.url)
        assert navigations == [srv.url, srv.url] and page.evaluate("() => crossOriginIsolated") is False
        info = ready_info(page)
        assert info["threads"] == 1
        assert page.inner_text("#m-runtime").startswith(
            f"WebAssembly, 1 thread ({NOT_ISOLATED}the site's service worker did not isolate the page) · fp32")
        page.context.close()
    finally:
        srv.shutdown()


def test_the_hosts_headers_isolate_the_page_without_the_worker(browser, example_dist):
    srv = serve(example_dist, isolation_headers=True)  # the site's _headers: COOP/COEP, as Netlify sends them
    try:
        page, navigations, _ = visit(browser, srv.url)
        assert navigations == [srv.url] and page.evaluate("() => crossOriginIsolated") is True
        assert page.evaluate("async () => (await navigator.serviceWorker.getRegistrations()).length") == 0
        info = ready_info(page)
        assert info["threads"] >= 2 and "cross-origin isolated: by the host's headers)" in page.inner_text("#m-runtime")
        page.context.close()
    finally:
        srv.shutdown()


@pytest.mark.browser
def test_bench_runs_the_threads_asked_for(example_dist, tmp_path):
    out = tmp_path / "bench.json"
    # gc() exposed: the tab's memory once V8 has collected its garbage too
    env = {**os.environ, "WEBBUILD_BROWSER_ARGS": "--js-flags=--expose-gc --liftoff-only"}
    run = webbuild("bench", example_dist, "--runtime", "browser", "--ep", "wasm", "--threads", "1", "--max-clips", "1",
                   "--decode-tokens", "2", "--max-new-tokens", "3", "--json", out, env=env)
    assert run.returncode == 0, run.stderr
    r = json.loads(out.read_text())
    # 3 new tokens: the answer's language tag and its first text token, short of the whole sentence
    assert (r["threads"], r["threads_why"]) == (1, "as asked") and r["clips"][0]["tokens"] == 3, r["clips"]
    # the memory issue 49 asks for beside the speed: the wasm heap the page's worker watched (it only grows), the
    # tab's process (page, workers and the wasm heap inside it), and the build's estimate they are held against
    heap = r["wasm_heap_bytes"]
    assert 16 * 2**20 < heap["loaded"] <= heap["peak"] < r["tab_peak_rss_bytes"], r
    assert heap["peak"] <= r["wasm_estimate_bytes"], r
    assert heap["peak"] < r["tab_rss_after_gc_bytes"] <= r["tab_peak_rss_bytes"] and r["tab_rss_bytes"], r
    assert "wasm heap" in run.stdout and "tab memory" in run.stdout, run.stdout
    node = webbuild("bench", example_dist, "--ep", "wasm", "--threads", "2")
    assert node.returncode == 2 and node.stderr.strip().endswith(
        "--threads is for --runtime browser: under Node onnxruntime-web runs 1 thread (its threaded glue does not "
        "load from file: URLs)"), node.stderr


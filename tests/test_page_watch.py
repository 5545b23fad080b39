"""A model worker that stops answering during the load (app/watched-worker.js): the page ends it after ?stall_s= of
silence and loads again in a fresh worker, once, with a warning naming the step it stopped after; where the fresh
worker stalls too, the load fails with one line. The stall is real: a script put before the site's worker blocks its
thread once it has posted its first progress message (the thread busy for good, as a Firefox page was seen)."""

from __future__ import annotations

from webbuild.tools.browser import WORKER, choose, launch, open_page, wait_for, watch
from webbuild.tools.serve import start

STALL_S = 10  # the page's watch; the example's worker, when it runs, speaks every 2 s at most

# put before worker.js: its thread blocked right after its first progress message
BLOCK = """
{
  const post = self.postMessage.bind(self);
  self.postMessage = (msg, ...rest) => {
    post(msg, ...rest);
    if (msg?.type === 'progress') for (;;) { /* blocked */ }
  };
}
"""


def load_with_blocked_workers(playwright, dist, blocked: int, retry: bool = False,
                              stall: str = str(STALL_S)) -> tuple[dict, int]:
    """The page's state once loaded (or failed) where the first `blocked` workers block, and how many it started;
    `retry`: then the page's "Try loading again" is pressed, and the state is the one after it."""
    srv = start(dist, quiet=True)
    browser = launch(playwright, choose(), False)
    started = []
    try:
        context = browser.new_context()

        def serve_worker(route):
            started.append(route.request.url)
            response = route.fetch()
            body = (BLOCK if len(started) <= blocked else "") + response.text()
            route.fulfill(response=response, body=body)

        context.route(WORKER, serve_worker)
        page = context.new_page()
        watch(page)
        open_page(page, f"{srv.url}?ep=wasm&stall_s={stall}", timeout_s=180)
        if retry:
            page.click("#retry")
            wait_for(page, "() => ['ready', 'error'].includes(window.webbuild?.status)", 180)
        return page.evaluate("window.webbuild"), len(started)
    finally:
        browser.close()
        srv.shutdown()


def test_a_worker_blocked_during_the_load_is_replaced_once_and_the_page_loads(playwright, example_dist):
    state, workers = load_with_blocked_workers(playwright, example_dist, blocked=1)
    assert workers == 2
    assert state["status"] == "ready", state["error"]
    assert [c["code"] for c in state["warningCodes"]] == ["worker-restarted"]
    warning = state["warnings"][0]
    assert "stopped answering" in warning and f'after "{state["stages"][0]}"' in warning, warning


def test_a_second_stall_fails_the_load_with_one_line(playwright, example_dist):
    state, workers = load_with_blocked_workers(playwright, example_dist, blocked=2)
    assert workers == 2
    assert state["status"] == "error"
    assert "stopped answering" in state["error"] and "again after a restart" in state["error"], state["error"]


def test_try_loading_again_after_two_stalls_starts_a_fresh_worker_at_once(playwright, example_dist):
    state, workers = load_with_blocked_workers(playwright, example_dist, blocked=2, retry=True)
    assert workers == 3
    assert state["status"] == "ready", state["error"]


def test_a_stall_bound_that_is_no_positive_number_is_the_default(playwright, example_dist):
    state, workers = load_with_blocked_workers(playwright, example_dist, blocked=0, stall="-1")
    assert workers == 1 and state["status"] == "ready" and state["warnings"] == [], state

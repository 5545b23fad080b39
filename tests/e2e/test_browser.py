"""Browser selection: explicit path or channel, then $WEBBUILD_BROWSER, then a system Chrome/Chromium,
then Playwright's own; SwiftShader WebGPU flags only without a GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from webbuild.errors import BrowserError
from webbuild.tools.browser import (
    ARGS_ENV,
    ENV,
    SWIFTSHADER,
    choose,
    hide_webgpu,
    launch,
    launch_args,
    wait_for_gpu,
)


def NONE(name):
    return None


def test_explicit_path_wins_over_env_and_system(tmp_path):
    exe = tmp_path / "my-chrome"
    exe.write_text("")
    c = choose(str(exe), env={ENV: "chrome"}, which=lambda n: "/usr/bin/" + n)
    assert (c.executable, c.channel, c.source) == (str(exe), None, "explicit")


def test_channel_from_env_then_system_then_playwright():
    c = choose(None, env={ENV: "chrome-beta"}, which=lambda n: "/usr/bin/" + n)
    assert (c.channel, c.executable, c.source) == ("chrome-beta", None, "env")
    c = choose(None, env={}, which=lambda n: "/opt/bin/chromium" if n == "chromium" else None)
    assert (c.executable, c.source) == ("/opt/bin/chromium", "system")
    c = choose(None, env={}, which=NONE)
    assert (c.executable, c.channel, c.source) == (None, None, "playwright")


def test_missing_browser_is_an_error(tmp_path):
    with pytest.raises(BrowserError, match="neither a file nor one of the channels"):
        choose(str(tmp_path / "nope"), env={}, which=NONE)


def test_swiftshader_flags_only_without_gpu():
    assert set(SWIFTSHADER) <= set(choose(None, env={}, which=NONE, gpu=False).args)
    with_gpu = choose(None, env={}, which=NONE, gpu=True).args
    assert "--enable-unsafe-webgpu" in with_gpu and not set(SWIFTSHADER) & set(with_gpu)


def test_extra_flags_from_env_reach_every_launch():
    env = {ARGS_ENV: "--use-angle=vulkan --enable-features=Vulkan '--vmodule=a=1,b c=2'"}
    c = choose(None, env=env, which=NONE, gpu=True)
    flags = ["--use-angle=vulkan", "--enable-features=Vulkan", "--vmodule=a=1,b c=2"]
    assert c.extra == flags and ARGS_ENV in c.describe()
    assert launch_args(c)[-3:] == flags and "--enable-unsafe-webgpu" in launch_args(c)
    off = launch_args(c, webgpu=False, extra=["--x"])  # WebGPU off: the flags still apply
    assert off[-4:] == [*flags, "--x"] and "--enable-unsafe-webgpu" not in off
    assert choose(None, env={}, which=NONE).extra == []


class _Cdp:
    def __init__(self, fail=False):
        self.fail, self.detached = fail, False

    def send(self, method):
        if self.fail:
            raise RuntimeError("not Chromium")
        return {"method": method}

    def detach(self):
        self.detached = True


def _page(browser):
    return SimpleNamespace(context=SimpleNamespace(browser=browser))


def test_wait_for_gpu_asks_the_browser_for_its_gpu_report():
    cdp = _Cdp()
    assert wait_for_gpu(_page(SimpleNamespace(new_browser_cdp_session=lambda: cdp))) == {"method": "SystemInfo.getInfo"}
    assert cdp.detached
    assert wait_for_gpu(_page(SimpleNamespace(new_browser_cdp_session=lambda: _Cdp(fail=True)))) is None
    assert wait_for_gpu(_page(None)) is None  # persistent context: no browser object


WORKER_JS = "postMessage([!!self.navigator.gpu, !!(self.navigator.gpu && await self.navigator.gpu.requestAdapter())]);"
ASK = """async () => {
  const w = new Worker('worker.js', { type: 'module' });
  const worker = await new Promise(r => { w.onmessage = e => r(e.data); });
  return { page: !!navigator.gpu, worker };
}"""


@pytest.mark.browser
def test_hide_webgpu_takes_it_from_pages_and_the_worker_even_with_webgpu_flags(tmp_path):
    """Launched WITH the WebGPU flags (SwiftShader's adapter exists), a hidden context still sees no
    WebGPU, in the page and in the site's worker: the fallback check cannot depend on a switch."""
    from playwright.sync_api import sync_playwright

    from webbuild.tools.serve import start

    (tmp_path / "index.html").write_text("<p>x</p>")
    (tmp_path / "worker.js").write_text(WORKER_JS)
    choice = choose(env={}, gpu=False)  # a system Chromium (the browser lane's)
    srv = start(tmp_path, quiet=True)
    with sync_playwright() as p:
        browser = launch(p, choice, webgpu=True)
        try:
            seen = {}
            for hidden in (False, True):
                context = browser.new_context()
                if hidden:
                    hide_webgpu(context)
                page = context.new_page()
                page.goto(srv.url)
                seen[hidden] = page.evaluate(ASK)
        finally:
            browser.close()
            srv.shutdown()
    assert seen[False] == {"page": True, "worker": [True, True]}  # the control: WebGPU is there
    assert seen[True] == {"page": False, "worker": [False, False]}

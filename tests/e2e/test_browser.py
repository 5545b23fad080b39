"""Browser selection: explicit path or channel, then $WEBBUILD_BROWSER, then a system Chrome/Chromium,
then Playwright's own; SwiftShader WebGPU flags only without a GPU."""

from __future__ import annotations

import pytest

from webbuild.errors import BrowserError
from webbuild.tools.browser import ENV, SWIFTSHADER, choose

NONE = lambda name: None  # noqa: E731 (no browser on PATH)


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

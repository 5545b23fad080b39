"""`webbuild serve`: MIME types, headers, base path, ranges, and no way out of the site folder."""

from __future__ import annotations

import http.client
import os

import pytest
from click.testing import CliRunner

from webbuild.cli import main
from webbuild.tools.serve import headers_for, parse_headers_file, start


@pytest.fixture()
def site(tmp_path):
    root = tmp_path / "site"
    (root / "ort").mkdir(parents=True)
    (root / "index.html").write_text("<!doctype html><title>t</title>")
    (root / "ort" / "x.wasm").write_bytes(b"\0asm" + bytes(100))
    (root / "ort" / "x.mjs").write_text("export {};")
    (root / "app.js").write_text("import './ort/x.mjs';")
    (root / ".nojekyll").write_bytes(b"")  # an empty file, as the hosting extras write
    (root / "sub").mkdir()
    (root / "sub" / "index.html").write_text("sub")
    (root / "_headers").write_text("/*\n  X-Test: all\n  Cache-Control: no-cache\n"
                                   "/ort/*\n  Cache-Control: max-age=60\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("outside the site")
    (root / "escape.txt").symlink_to(secret)
    (root / "escape-dir").symlink_to(tmp_path)
    (root / "inside.js").symlink_to(root / "app.js")
    return root


@pytest.fixture()
def server(site):
    srv = start(site, quiet=True)
    yield srv
    srv.shutdown()
    srv.server_close()


def get(srv, path, headers=None, method="GET"):
    host, port = srv.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request(method, path, headers=headers or {})  # http.client sends the path as is: no normalising
    res = conn.getresponse()
    body = res.read()
    conn.close()
    return res.status, dict(res.getheaders()), body


def test_mime_types(server):
    assert get(server, "/ort/x.wasm")[1]["Content-Type"] == "application/wasm"
    assert get(server, "/ort/x.mjs")[1]["Content-Type"].startswith("text/javascript")
    assert get(server, "/app.js")[1]["Content-Type"].startswith("text/javascript")
    status, headers, body = get(server, "/")
    assert (status, headers["Content-Type"], body) == (
        200, "text/html; charset=utf-8", b"<!doctype html><title>t</title>")


@pytest.mark.parametrize("path", [
    "/../secret.txt", "/ort/../../secret.txt", "/%2e%2e/secret.txt", "/ort/%2E%2E/%2e%2e/secret.txt",
    "/..%2fsecret.txt", "/ort%2f..%2f..%2fsecret.txt", "/escape.txt", "/escape-dir/secret.txt",
    "/..\\secret.txt", "/%5c..%5csecret.txt", "/nope.txt", "/ort/x.wasm%00",
    "//etc/passwd", "/%2fetc/passwd",
])
def test_nothing_outside_the_site(server, path):
    status, _, body = get(server, path)
    assert status == 404
    assert b"outside the site" not in body


def test_symlink_inside_the_site_is_served(server):
    assert get(server, "/inside.js")[2] == b"import './ort/x.mjs';"


def test_headers_file_is_applied_and_coop_coep_optional(site, server):
    _, headers, _ = get(server, "/ort/x.mjs")
    assert headers["X-Test"] == "all" and headers["Cache-Control"] == "max-age=60"
    assert "Cross-Origin-Embedder-Policy" not in headers
    isolated = start(site, quiet=True, coop_coep=True)
    try:
        _, headers, _ = get(isolated, "/")
        assert headers["Cross-Origin-Opener-Policy"] == "same-origin"
        assert headers["Cross-Origin-Embedder-Policy"] == "require-corp"
    finally:
        isolated.shutdown()
        isolated.server_close()


def test_isolation_headers_can_be_switched_off(site):
    """--no-isolation-headers: no COOP/COEP, not even the site's _headers' (as GitHub Pages serves a site); the
    rest of _headers still applies, and asking for COOP/COEP at once is refused."""
    (site / "_headers").write_text("/*\n  X-Test: all\n  Cross-Origin-Opener-Policy: same-origin\n"
                                   "  cross-origin-embedder-policy: require-corp\n")
    for isolation_headers, sent in ((True, True), (False, False)):
        srv = start(site, quiet=True, isolation_headers=isolation_headers)
        try:
            _, headers, _ = get(srv, "/")
            names = {name.lower() for name in headers}
            assert headers["X-Test"] == "all"
            assert ({"cross-origin-opener-policy", "cross-origin-embedder-policy"} <= names) == sent
            assert bool(names & {"cross-origin-opener-policy", "cross-origin-embedder-policy"}) == sent
        finally:
            srv.shutdown()
            srv.server_close()
    (site / "model").mkdir()
    (site / "model" / "manifest.json").write_text("{}")  # a built site, as far as `webbuild serve` checks
    res = CliRunner().invoke(main, ["serve", str(site), "--coop-coep", "--no-isolation-headers"])
    assert res.exit_code == 2 and "--coop-coep and --no-isolation-headers contradict each other" in res.output


def test_base_path(site):
    srv = start(site, quiet=True, base_path="/repo/")
    try:
        assert srv.url.endswith("/repo/")
        assert get(srv, "/repo/")[0] == 200
        assert get(srv, "/index.html")[0] == 404
        status, headers, _ = get(srv, "/repo")
        assert (status, headers["Location"]) == (301, "/repo/")
        status, headers, _ = get(srv, "/repo/sub")  # a folder needs the slash for its relative URLs
        assert (status, headers["Location"]) == (301, "/repo/sub/")
        assert get(srv, "/repo/../secret.txt")[0] == 404
    finally:
        srv.shutdown()
        srv.server_close()


def test_range_resume(server):
    status, headers, body = get(server, "/ort/x.wasm", {"Range": "bytes=4-"})
    assert status == 206 and headers["Content-Range"] == "bytes 4-103/104" and body == bytes(100)
    status, _, body = get(server, "/ort/x.wasm", method="HEAD")
    assert status == 200 and body == b""


def test_an_empty_file_is_an_empty_body_and_the_connection_goes_on(server):
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=10)  # one keep-alive connection for both files
    try:
        conn.request("GET", "/.nojekyll")
        res = conn.getresponse()
        assert (res.status, res.getheader("Content-Length"), res.read()) == (200, "0", b"")
        conn.request("GET", "/ort/x.wasm")
        assert conn.getresponse().read() == b"\0asm" + bytes(100)
    finally:
        conn.close()


def test_loopback_by_default(server):
    assert server.server_address[0] == "127.0.0.1"
    params = {p.name: p.default for p in main.commands["serve"].params}
    assert params["host"] == "127.0.0.1"


def test_headers_file_parsing():
    rules = parse_headers_file("# c\n/model/shards/*\n  Cache-Control: immutable\n/*\n  A: b: c\n")
    assert headers_for(rules, "/model/shards/x.bin") == {"Cache-Control": "immutable", "A": "b: c"}
    assert headers_for(rules, "/index.html") == {"A": "b: c"}


def test_cli_missing_dir(tmp_path):
    res = CliRunner().invoke(main, ["serve", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "does not exist" in res.output


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_unreadable_file_is_not_a_crash(site, server):  # pragma: no cover - CI runs as root
    (site / "app.js").chmod(0)
    assert get(server, "/app.js")[0] in (403, 404, 500)

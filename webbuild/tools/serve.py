"""`webbuild serve DIR`: a local preview server for a built site.

- Serves only files under DIR: a path with `..`, an encoded separator, or a symlink whose target
  lies outside DIR answers 404, whatever the request looks like.
- MIME types the browser insists on (`application/wasm`, `text/javascript` for .mjs).
- The site's `_headers` file (Netlify / Cloudflare Pages format) is applied, so the preview sends
  what those hosts send (CSP, caching); `coop_coep` adds cross-origin isolation (wasm threads)
  for sites whose `_headers` lacks it, and `isolation_headers=False` takes COOP/COEP out of every
  response, as GitHub Pages serves a site (no headers of the site's own: its isolation service worker's case).
- Loopback by default; `base_path` mounts the site under a sub-path, as on a project page.
- Single byte ranges (`Range: bytes=N-`), which the shard loader uses to resume a dropped download.
"""

from __future__ import annotations

import errno
import re
import socket
import sys
import threading
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

from webbuild.errors import ServeError

MIME = {
    ".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
    ".json": "application/json", ".wasm": "application/wasm", ".wav": "audio/wav",
    ".mp3": "audio/mpeg", ".ogg": "audio/ogg", ".webm": "audio/webm", ".png": "image/png",
    ".svg": "image/svg+xml", ".txt": "text/plain; charset=utf-8", ".md": "text/plain; charset=utf-8",
    ".onnx": "application/octet-stream", ".bin": "application/octet-stream", ".map": "application/json",
}
ISOLATION = {"Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp"}
ISOLATION_NAMES = {name.lower() for name in ISOLATION}
LOOPBACK = {"127.0.0.1", "::1", "localhost"}
SITE_FILES = ("index.html", "model/manifest.json")  # what every built site has


def parse_headers_file(text: str) -> list[tuple[re.Pattern, list[tuple[str, str]]]]:
    """Netlify/Cloudflare `_headers`: a path pattern line, then indented `Name: value` lines."""
    rules: list[tuple[re.Pattern, list[tuple[str, str]]]] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line[0].isspace():
            pattern = "^" + re.escape(line.strip()).replace(r"\*", ".*") + "$"
            rules.append((re.compile(pattern), []))
        elif rules and ":" in line:
            name, value = line.strip().split(":", 1)
            rules[-1][1].append((name.strip(), value.strip()))
    return rules


def headers_for(rules, url_path: str) -> dict[str, str]:
    """Headers of every matching rule; a later rule overrides an earlier one's same header."""
    out: dict[str, str] = {}
    for pattern, headers in rules:
        if pattern.match(url_path):
            out.update(headers)
    return out


def resolve(root: Path, rel: str) -> Path | None:
    """The file under `root` for URL path `rel` (already without the base path), or None."""
    parts = [p for p in unquote(rel).split("/") if p]
    if any(p in (".", "..") or "\\" in p or "\0" in p for p in parts):
        return None
    target = root.joinpath(*parts)
    if target.is_dir():
        target = target / "index.html"
    try:
        real = target.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    # the real path decides: a symlink inside root that points outside it is refused
    if real != root and root not in real.parents:
        return None
    return real if real.is_file() else None


class SiteServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, host: str, port: int, base_path: str = "/", coop_coep: bool = False,
                 quiet: bool = False, isolation_headers: bool = True):
        if not Path(root).exists():
            raise ServeError(f"{root} does not exist; build the site first (webbuild model.yaml)")
        if not Path(root).is_dir():
            raise ServeError(f"{root} is not a folder; build the site first (webbuild model.yaml)")
        self.root = Path(root).resolve(strict=True)
        if not (base_path.startswith("/") and base_path.endswith("/")):
            raise ServeError(f"base path must start and end with '/', got {base_path!r}")
        if coop_coep and not isolation_headers:
            raise ServeError("--coop-coep and --no-isolation-headers contradict each other: pick one")
        self.base_path, self.coop_coep, self.quiet = base_path, coop_coep, quiet
        self.isolation_headers = isolation_headers
        headers_file = self.root / "_headers"
        self.rules = parse_headers_file(headers_file.read_text()) if headers_file.is_file() else []
        self.log: list[str] = []  # request paths, for tests
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            super().__init__((host, port), Handler)
        except OSError as exc:
            raise ServeError(_listen_error(host, port, exc)) from None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        assert isinstance(host, str)  # a TCP server's (AF_INET, AF_INET6) address
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}{self.base_path}"


def _listen_error(host: str, port: int, exc: OSError) -> str:
    """Why the socket could not be bound, and the option that fixes it."""
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} is in use: pick another with --port"
    if exc.errno == errno.EACCES:
        return f"port {port} needs privileges: pick one above 1023 with --port"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{host} is not an address of this machine: pick another with --host"
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"


class Handler(BaseHTTPRequestHandler):
    server: SiteServer
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self._serve(body=True)

    def do_HEAD(self):
        self._serve(body=False)

    def _serve(self, body: bool) -> None:
        path = urlsplit(self.path).path
        self.server.log.append(path)
        base = self.server.base_path
        if path + "/" == base:
            return self._redirect(base)
        if not path.startswith(base):
            return self._error(HTTPStatus.NOT_FOUND)
        rel = path[len(base):]
        file = resolve(self.server.root, rel)
        if file is None:
            return self._error(HTTPStatus.NOT_FOUND)
        if file.name == "index.html" and rel and not rel.endswith(("/", "index.html")):
            return self._redirect(path + "/")  # relative URLs in the page need the slash
        self._send_file(file, path, body)

    def _send_file(self, file: Path, url_path: str, body: bool) -> None:
        size = file.stat().st_size
        start, end, status = 0, size, HTTPStatus.OK
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if m and int(m.group(1)) < size:
            start = int(m.group(1))
            end = min(size, int(m.group(2)) + 1) if m.group(2) else size
            status = HTTPStatus.PARTIAL_CONTENT
        self.send_response(status)
        self.send_header("Content-Type", MIME.get(file.suffix, "application/octet-stream"))
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Last-Modified", formatdate(file.stat().st_mtime, usegmt=True))
        if status == HTTPStatus.PARTIAL_CONTENT:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        for name, value in self._site_headers(url_path).items():
            self.send_header(name, value)
        self.end_headers()
        if body:
            self._copy(file, start, end)

    def _site_headers(self, url_path: str) -> dict[str, str]:
        headers = {"Cache-Control": "no-cache"} | headers_for(self.server.rules, url_path)
        if not self.server.isolation_headers:
            return {k: v for k, v in headers.items() if k.lower() not in ISOLATION_NAMES}
        return headers | ISOLATION if self.server.coop_coep else headers

    def _copy(self, file: Path, start: int, end: int) -> None:
        with file.open("rb") as f:
            send_file(self, f, start, end - start)

    def _redirect(self, location: str) -> None:
        self.send_response(HTTPStatus.MOVED_PERMANENTLY)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _error(self, status: HTTPStatus) -> None:
        body = f"{status.value} {status.phrase}\n".encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format, *args):
        if not self.server.quiet:
            sys.stderr.write(f"{self.address_string()} {format % args}\n")


def send_file(handler: BaseHTTPRequestHandler, f: BinaryIO, start: int = 0, count: int | None = None) -> None:
    """`count` bytes of the open file `f` from `start` (None: to its end) as the response body of `handler`, through
    socket.sendfile: the kernel copies the file into the socket (os.sendfile), about twice the rate of a read/write
    loop through Python; the model's shards are most of a load's bytes."""
    try:
        handler.wfile.flush()  # the headers first
        if count != 0:  # socket.sendfile refuses a count of 0: an empty file (a host's .nojekyll) has no body
            handler.connection.sendfile(f, start, count)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the browser went away mid-file (a cancelled load): nothing to do


def start(root: Path, host: str = "127.0.0.1", port: int = 0, **kw) -> SiteServer:
    """Start a server in a background thread (port 0: any free port); stop with .shutdown()."""
    srv = SiteServer(root, host, port, **kw)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def check_site(root: Path) -> None:
    """`webbuild serve` previews built sites only: any other folder (the source export, the project)
    would be served as a wall of 404s, so it is refused with what is missing. The tests' and
    verify's servers (`start`) serve any folder."""
    missing = [name for name in SITE_FILES if not (Path(root) / name).is_file()]
    if Path(root).is_dir() and missing:
        raise ServeError(f"{root} is not a built site (no {' or '.join(missing)}); "
                         "`webbuild model.yaml` builds one into dist/")


def serve_forever(root: Path, host: str, port: int, **kw) -> None:
    check_site(root)
    srv = SiteServer(root, host, port, **kw)
    if host not in LOOPBACK:
        print(f"warning: serving on {host}: other machines on the network can reach it", file=sys.stderr)
    print(f"serving {srv.root} at {srv.url} (Ctrl-C stops)", file=sys.stderr)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()


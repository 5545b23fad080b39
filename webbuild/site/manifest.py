"""The shard manifest format (version 1): constants, reading, verifying, and dist/ size checks.

``manifest.json`` (see ``webbuild/site/schemas/manifest.schema.json`` and docs/packaging.md)::

    {"format": "webbuild-manifest", "format_version": 1,
     "model_id": "qwen3-asr-0.6b", "version": "<sha256 hex>",
     "max_shard_bytes": 26214400, "total_bytes": 123,
     "variants": {"fp16": {"files": ["decoder.fp16.onnx", ...], ...}},
     "shards": [{"path": "shards/<stem>.<index>.<sha256[:16]>.bin", "size": 123, "sha256": "..."}],
     "files": {"decoder.fp16.onnx.data": {"size": 123, "sha256": "...",
               "parts": [{"shard": "shards/...bin", "offset": 0, "length": 123}]}}}

A file is the concatenation of its parts in order; a part is ``length`` bytes of ``shard``
starting at ``offset`` within that shard. ``version`` is the sha256 of the canonical JSON of
everything else, so any change of bytes, reassembly, variants or id gives a new version.

``verify_manifest(dist_dir) -> list[str]`` re-hashes every shard and every reassembled file;
an empty list means the package is intact. ``dist_file_stats(dist_dir, max_bytes)`` walks every
file of a site for the build report (`max_file_bytes`, `total_bytes`, oversize files).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from webbuild.errors import SourceError

FORMAT = "webbuild-manifest"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
SHARD_DIR = "shards"
DEFAULT_MAX_BYTES = 25 * 1024 * 1024  # Cloudflare Pages' per-file cap, the strictest common host
# Chrome allocates no single ArrayBuffer of 2 GiB (1.9 GiB works; checked in Chromium 150).
BROWSER_MAX_FILE_BYTES = 2**31 - 1
SCHEMA_PATH = Path(__file__).parent / "schemas" / "manifest.schema.json"
_BLOCK = 1 << 20


def version_hash(manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != "version"}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canon.encode()).hexdigest()


def write_json_atomic(path: Path, data: dict) -> None:
    # Written beside and renamed: a crash never leaves a half manifest that names missing shards.
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def load_manifest(dist_dir: str | os.PathLike) -> dict:
    path = Path(dist_dir) / MANIFEST_NAME
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SourceError(f"{path}: cannot read manifest: {e}; rebuild the site") from e
    fields = m if isinstance(m, dict) else {}
    if (fields.get("format"), fields.get("format_version")) != (FORMAT, FORMAT_VERSION):
        raise SourceError(f"{path}: not a {FORMAT} v{FORMAT_VERSION} manifest "
                          f"(format={fields.get('format')!r}, format_version={fields.get('format_version')!r}); "
                          "rebuild the site")
    return m


def reassemble(dist_dir: str | os.PathLike, manifest: dict, name: str, dest: str | os.PathLike) -> None:
    """Write logical file `name` to `dest` from its shards (streamed, range by range)."""
    root = Path(dist_dir)
    if name not in manifest["files"]:
        raise SourceError(f"{root}/{MANIFEST_NAME}: no file {name!r}; rebuild the site")
    with open(dest, "wb") as out:
        for part in manifest["files"][name]["parts"]:
            _copy_part(root / part["shard"], part["offset"], part["length"], out)


def _copy_part(shard_path: Path, offset: int, length: int, out) -> None:
    """A missing or short shard is the site's problem, not a bug: one line for the user."""
    try:
        with open(shard_path, "rb") as shard:
            shard.seek(offset)
            while length:
                block = shard.read(min(length, _BLOCK))
                if not block:
                    raise SourceError(f"{shard_path}: shorter than the manifest says; rebuild the site")
                out.write(block)
                length -= len(block)
    except OSError as e:
        raise SourceError(f"{shard_path}: cannot read shard: {e.strerror}; rebuild the site") from e


def verify_manifest(dist_dir: str | os.PathLike, *, check_files: bool = True) -> list[str]:
    """Problems found in the package under dist_dir (empty list: all shards and files intact)."""
    root = Path(dist_dir)
    try:
        m = load_manifest(root)
    except SourceError as e:
        return [str(e)]
    try:
        return _verify(root, m, check_files)
    except (KeyError, TypeError, AttributeError) as e:
        return [f"manifest: malformed ({type(e).__name__}: {e})"]


def _verify(root: Path, m: dict, check_files: bool) -> list[str]:
    problems = []
    if version_hash(m) != m.get("version"):
        problems.append("manifest: version hash does not match its content (edited by hand?)")
    shards = {s["path"]: s for s in m["shards"]}
    for s in m["shards"]:
        problems += _check_shard(root, s, m["max_shard_bytes"])
    for name, f in m["files"].items():
        problems += _check_parts(name, f, shards)
    for vname, v in m["variants"].items():
        problems += [f"variant {vname}: unknown file {n}" for n in v["files"] if n not in m["files"]]
    for aname, a in m.get("adapters", {}).items():
        problems += [] if a["file"] in m["files"] else [f"adapter {aname}: unknown file {a['file']}"]
    if check_files and not problems:  # reassembly check only makes sense on intact shards
        problems += [p for name, f in m["files"].items() if (p := _check_file(root, name, f))]
    return problems


def check_shards(dist_dir: str | os.PathLike, manifest: dict) -> None:
    """Every shard of the manifest against its size and sha256, as the page checks what it downloads: a
    SourceError naming the first that differs (a site damaged on disk or in a copy)."""
    root = Path(dist_dir)
    try:
        shards = [(root / s["path"], s["size"], s["sha256"]) for s in manifest["shards"]]
    except (KeyError, TypeError) as exc:
        raise SourceError(f"{root / MANIFEST_NAME}: malformed shard list ({exc!r}); rebuild the site") from None
    for path, size, sha256 in shards:
        if not path.is_file():
            raise SourceError(f"{path}: missing; rebuild the site or copy it again")
        if path.stat().st_size != size or (digest := _sha256_file(path)) != sha256:
            found = f"{path.stat().st_size} bytes" if path.stat().st_size != size else f"sha256 {digest}"
            raise SourceError(f"{path}: {found}, the manifest says {size} bytes, sha256 {sha256}; rebuild the site "
                              "or copy it again")


def _check_shard(root: Path, s: dict, max_bytes: int) -> list[str]:
    p = root / s["path"]
    if not p.is_file():
        return [f"{s['path']}: missing"]
    size = p.stat().st_size
    if size != s["size"]:
        return [f"{s['path']}: size {size} != manifest {s['size']}"]
    if size > max_bytes:
        return [f"{s['path']}: size {size} exceeds shard limit {max_bytes}"]
    digest = _sha256_file(p)
    return [] if digest == s["sha256"] else [f"{s['path']}: sha256 {digest} != manifest {s['sha256']}"]


def _check_parts(name: str, f: dict, shards: dict) -> list[str]:
    problems = []
    for i, part in enumerate(f["parts"]):
        s = shards.get(part["shard"])
        if s is None:
            problems.append(f"{name}: part {i} names unknown shard {part['shard']}")
        elif part["offset"] + part["length"] > s["size"]:
            problems.append(f"{name}: part {i} reads past the end of {part['shard']}")
    total = sum(p["length"] for p in f["parts"])
    if total != f["size"]:
        problems.append(f"{name}: parts add up to {total} bytes, manifest says {f['size']}")
    return problems


def _check_file(root: Path, name: str, f: dict) -> str | None:
    h = hashlib.sha256()
    for part in f["parts"]:
        with (root / part["shard"]).open("rb") as fh:
            fh.seek(part["offset"])
            left = part["length"]
            while left:
                block = fh.read(min(_BLOCK, left))
                h.update(block)
                left -= len(block)
    digest = h.hexdigest()
    return None if digest == f["sha256"] else f"{name}: reassembled sha256 {digest} != manifest {f['sha256']}"


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def dist_file_stats(dist_dir: str | os.PathLike, max_bytes: int = DEFAULT_MAX_BYTES) -> dict:
    """Sizes of every file under dist_dir: the numbers build-report.json records."""
    sizes = {str(p.relative_to(dist_dir)): p.stat().st_size
             for p in Path(dist_dir).rglob("*") if p.is_file()}
    return {
        "file_count": len(sizes),
        "total_bytes": sum(sizes.values()),
        "max_file_bytes": max(sizes.values(), default=0),
        "shard_limit_bytes": max_bytes,
        "oversize_files": sorted(n for n, s in sizes.items() if s > max_bytes),
    }

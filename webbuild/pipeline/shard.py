"""Packaging stage: split logical files into content-hashed shards and write `manifest.json`.

API
---
``shard_files(files, out_dir, *, model_id, variants=None, max_bytes=DEFAULT_MAX_BYTES) -> dict``
    ``files`` maps a logical name (what the site asks for, e.g. ``"decoder.fp16.onnx.data"`` or
    ``"ort-wasm-simd-threaded.asyncify.wasm"``) to a source path. Each file is cut into byte ranges
    of at most ``max_bytes``; each range becomes ``out_dir/shards/<name>.<index>.<sha256[:16]>.bin``.
    ``variants`` maps a variant name to ``{"files": [logical names], ...anything else}``.
    Writes ``out_dir/manifest.json`` last and returns the manifest dict. Stale ``*.bin`` files
    in ``out_dir/shards/`` from an earlier run are removed so a re-run never ships dead bytes.

``python -m webbuild.pipeline.shard OUT_DIR NAME=PATH ... --model-id ID [--max-bytes N]
[--variant NAME=FILE,FILE]`` does the same from the shell (used by the loader's JS tests).

Why one file per shard (no packing of small files into a shared shard): a shard's bytes then
depend on one logical file only, so a new build that changes one file (a new ORT wasm, a
re-quantized decoder) changes only that file's shards and browsers keep every other shard in
their cache; a visitor who loads the fp16 variant never downloads fp32 bytes packed beside it.
The cost is one request per small file (a handful: configs, tokenizer). Identical byte ranges
(same sha256) are stored once, so two variants sharing an encoder cost nothing twice.

All I/O is streamed in 1 MiB blocks: memory stays flat for multi-GB files. Reading, verifying
and the format itself live in `webbuild.site.manifest`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from webbuild import text
from webbuild.errors import BuildError
from webbuild.site.manifest import (
    BROWSER_MAX_FILE_BYTES,
    DEFAULT_MAX_BYTES,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    SHARD_DIR,
    version_hash,
    write_json_atomic,
)

_BLOCK = 1 << 20  # streaming block; keeps memory flat whatever the file size
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
_SHARD_RE = re.compile(r"\.[0-9a-f]{16}\.bin$")


def shard_files(
    files: Mapping[str, str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    model_id: str,
    variants: Mapping[str, Mapping[str, Any]] | None = None,
    adapters: Mapping[str, Mapping[str, Any]] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_file_bytes: int | None = BROWSER_MAX_FILE_BYTES,
) -> dict:
    """Write content-hashed shards of `files` and `manifest.json` into `out_dir`; return the manifest.

    `max_file_bytes` refuses logical files a browser cannot hold in one buffer (None: no check).
    `adapters` (name -> entry, docs/adapters.md) is listed when there are any.
    """
    _check_inputs(files, model_id, variants or {}, max_bytes)
    _check_browser_sizes(files, max_file_bytes)
    out = Path(out_dir)
    shard_dir = out / SHARD_DIR
    shard_dir.mkdir(parents=True, exist_ok=True)
    shards: dict[str, dict] = {}  # sha256 -> shard entry (dedupes identical ranges)
    entries = {name: _shard_one(name, Path(src), shard_dir, max_bytes, shards)
               for name, src in sorted(files.items())}
    _remove_stale(shard_dir, {Path(s["path"]).name for s in shards.values()})
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model_id": model_id,
        "version": "",
        "max_shard_bytes": max_bytes,
        "total_bytes": sum(s["size"] for s in shards.values()),
        "variants": {k: dict(v) for k, v in (variants or {}).items()},
        **({"adapters": {k: dict(v) for k, v in adapters.items()}} if adapters else {}),
        "shards": sorted(shards.values(), key=lambda s: s["path"]),
        "files": entries,
    }
    manifest["version"] = version_hash(manifest)
    write_json_atomic(out / MANIFEST_NAME, manifest)
    return manifest


def _check_inputs(files, model_id, variants, max_bytes) -> None:
    if not isinstance(max_bytes, int) or max_bytes < 1:
        raise BuildError(f"shard max_bytes must be a positive integer, got {max_bytes!r}")
    if not model_id or _SAFE.search(model_id):
        raise BuildError(f"model_id {model_id!r} must be non-empty and use only A-Z a-z 0-9 . _ -")
    if not files:
        raise BuildError("no files to shard")
    for name, src in files.items():
        if not name or name.startswith(("/", ".")) or "\\" in name:
            raise BuildError(f"logical file name {name!r} must be a relative name")
        if not Path(src).is_file():
            raise BuildError(f"{name}: source {src} does not exist or is not a regular file")
    for vname, v in variants.items():
        missing = [f for f in v.get("files", ()) if f not in files] if isinstance(v, Mapping) else None
        if missing is None or "files" not in v:
            raise BuildError(f"variant {vname!r} must be a mapping with a 'files' list")
        if missing:
            raise BuildError(f"variant {vname!r} names files that are not packaged: {', '.join(missing)}")


def _check_browser_sizes(files, limit) -> None:
    # The loader hands each logical file to onnxruntime-web as one Uint8Array; Chrome cannot
    # allocate one of 2 GiB or more, so such a site would build fine and never load.
    for name, src in files.items():
        size = Path(src).stat().st_size
        if limit is not None and size > limit:
            raise BuildError(f"{name}: {text.size(size)} is more than a browser can hold in one buffer "
                             f"({text.size(limit)}); quantize it or split the external data per graph")


def _shard_one(name: str, src: Path, shard_dir: Path, max_bytes: int, shards: dict) -> dict:
    """Split one file into shards; return its manifest entry {size, sha256, parts}."""
    whole = hashlib.sha256()
    parts, size = [], 0
    stem = _SAFE.sub("_", name)
    try:
        with src.open("rb") as f:
            index = 0
            while True:
                part = _write_part(f, shard_dir / f".{stem}.{index}.tmp", max_bytes, whole)
                if part is None:
                    break
                tmp, digest, length = part
                parts.append({"shard": _place(tmp, f"{stem}.{index:05d}", digest, length, shards),
                              "offset": 0, "length": length})
                size += length
                index += 1
    except OSError as e:
        for tmp in shard_dir.glob(f".{stem}.*.tmp"):  # no half-written leftovers in dist/
            tmp.unlink()
        raise BuildError(f"{name}: cannot shard {src}: {e}") from e
    # An empty file has no parts: no shard, and the loader allocates a zero-length buffer.
    return {"size": size, "sha256": whole.hexdigest(), "parts": parts}


def _write_part(f, tmp: Path, max_bytes: int, whole) -> tuple[Path, str, int] | None:
    """Copy up to max_bytes from f into tmp, hashing as it goes; None at end of file."""
    h, length = hashlib.sha256(), 0
    with tmp.open("wb") as out:
        while length < max_bytes:
            block = f.read(min(_BLOCK, max_bytes - length))
            if not block:
                break
            h.update(block)
            whole.update(block)
            out.write(block)
            length += len(block)
    if length == 0:
        tmp.unlink()
        return None
    return tmp, h.hexdigest(), length


def _place(tmp: Path, stem: str, digest: str, length: int, shards: dict) -> str:
    """Rename tmp to its content-hashed name (or drop it if an identical shard exists)."""
    if digest in shards:
        tmp.unlink()
        return shards[digest]["path"]
    final = tmp.with_name(f"{stem}.{digest[:16]}.bin")
    os.replace(tmp, final)
    path = f"{SHARD_DIR}/{final.name}"
    shards[digest] = {"path": path, "size": length, "sha256": digest}
    return path


def _remove_stale(shard_dir: Path, keep: set[str]) -> None:
    # Only our own name pattern: never delete a file someone else put there.
    for p in shard_dir.iterdir():
        if _SHARD_RE.search(p.name) and p.name not in keep:
            p.unlink()


def _parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m webbuild.pipeline.shard", description=__doc__.split("\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("files", nargs="+", metavar="NAME=PATH")
    ap.add_argument("--model-id", required=True)
    ap.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=FILE,FILE")
    ap.add_argument("--no-browser-limit", action="store_true",
                    help="allow logical files over 2 GiB (not loadable in a browser)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = _parse_args(argv)
    try:
        files = dict(_split_eq(a) for a in args.files)
        variants = {k: {"files": v.split(",") if v else []} for k, v in map(_split_eq, args.variant)}
        m = shard_files(files, args.out_dir, model_id=args.model_id, variants=variants,
                        max_bytes=args.max_bytes,
                        max_file_bytes=None if args.no_browser_limit else BROWSER_MAX_FILE_BYTES)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{len(m['shards'])} shards, {m['total_bytes']} bytes, version {m['version'][:16]}")
    return 0


def _split_eq(arg: str) -> tuple[str, str]:
    name, sep, value = arg.partition("=")
    if not sep:
        raise BuildError(f"expected NAME=VALUE, got {arg!r}")
    return name, value


if __name__ == "__main__":
    sys.exit(main())

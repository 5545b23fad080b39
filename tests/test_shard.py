"""Packaging stage: shards, manifest, verification (real files, real sha256)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from webbuild.errors import BuildError
from webbuild.pipeline.shard import shard_files
from webbuild.site.contract import VARIANTS
from webbuild.site.manifest import (
    DEFAULT_MAX_BYTES,
    SCHEMA_PATH,
    dist_file_stats,
    load_manifest,
    verify_manifest,
    version_hash,
)

LIMIT = 1000


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _reassemble(out: Path, entry: dict) -> bytes:
    return b"".join((out / p["shard"]).read_bytes()[p["offset"]:p["offset"] + p["length"]]
                    for p in entry["parts"])


@pytest.fixture
def sources(tmp_path):
    rnd = os.urandom
    src = tmp_path / "src"
    src.mkdir()
    return {
        "empty.json": _write(src / "empty.json", b""),
        "one.bin": _write(src / "one.bin", b"x"),
        "under.bin": _write(src / "under.bin", rnd(LIMIT - 1)),
        "at.bin": _write(src / "at.bin", rnd(LIMIT)),
        "over.bin": _write(src / "over.bin", rnd(LIMIT + 1)),
        "decoder.fp16.onnx.data": _write(src / "big.data", rnd(LIMIT * 3 + 17)),
    }


def _shard(sources, out, **kw):
    kw.setdefault("model_id", "tiny-asr")
    kw.setdefault("max_bytes", LIMIT)
    return shard_files(sources, out, **kw)


def test_reassembles_byte_exact_and_respects_limit(sources, tmp_path):
    out = tmp_path / "dist"
    m = _shard(sources, out)
    for name, src in sources.items():
        data = src.read_bytes()
        entry = m["files"][name]
        assert _reassemble(out, entry) == data, name
        assert entry["size"] == len(data)
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert all((out / s["path"]).stat().st_size <= LIMIT for s in m["shards"])
    stats = dist_file_stats(out / "shards", LIMIT)
    assert stats["max_file_bytes"] == LIMIT and stats["oversize_files"] == []


def test_part_counts_at_edges(sources, tmp_path):
    m = _shard(sources, tmp_path / "dist")
    counts = {n: len(f["parts"]) for n, f in m["files"].items()}
    assert counts == {"empty.json": 0, "one.bin": 1, "under.bin": 1, "at.bin": 1, "over.bin": 2,
                      "decoder.fp16.onnx.data": 4}
    assert [p["length"] for p in m["files"]["over.bin"]["parts"]] == [LIMIT, 1]


def test_shard_names_carry_content_hash(sources, tmp_path):
    out = tmp_path / "dist"
    m = _shard(sources, out)
    for s in m["shards"]:
        data = (out / s["path"]).read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        assert s["sha256"] == digest and s["size"] == len(data)
        assert s["path"].startswith("shards/") and s["path"].endswith(f".{digest[:16]}.bin")
    assert m["total_bytes"] == sum(s["size"] for s in m["shards"])


def test_identical_ranges_are_stored_once(tmp_path):
    data = os.urandom(2500)
    a = _write(tmp_path / "a", data)
    b = _write(tmp_path / "b", data)
    m = _shard({"enc.fp16.onnx": a, "enc.fp32.onnx": b}, tmp_path / "dist")
    assert len(m["shards"]) == 3
    assert m["files"]["enc.fp16.onnx"]["parts"] == m["files"]["enc.fp32.onnx"]["parts"]
    assert len(list((tmp_path / "dist" / "shards").iterdir())) == 3


def test_manifest_matches_schema_and_is_on_disk(sources, tmp_path):
    out = tmp_path / "dist"
    jsonschema = pytest.importorskip("jsonschema")  # in the `test` extra
    m = _shard(sources, out, variants={"fp16": {"files": ["decoder.fp16.onnx.data"], **VARIANTS["fp16"]}})
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(m, schema)
    assert load_manifest(out) == m
    assert m["variants"]["fp16"]["requires"] == ["shader-f16"]
    assert m["version"] == version_hash(m) and len(m["version"]) == 64


def test_schema_rejects_broken_manifests(sources, tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    m = _shard(sources, tmp_path / "dist")
    schema = json.loads(SCHEMA_PATH.read_text())
    bad_hash = json.loads(json.dumps(m))
    bad_hash["shards"][0]["sha256"] = "XYZ"
    no_parts = json.loads(json.dumps(m))
    del no_parts["files"]["one.bin"]["parts"]
    for bad in (bad_hash, no_parts, dict(m, format_version=2)):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_version_changes_with_content_and_not_otherwise(sources, tmp_path):
    v1 = _shard(sources, tmp_path / "a")["version"]
    assert _shard(sources, tmp_path / "b")["version"] == v1  # reproducible
    _write(sources["one.bin"], b"y")
    assert _shard(sources, tmp_path / "c")["version"] != v1


def test_rerun_removes_stale_shards_only(sources, tmp_path):
    out = tmp_path / "dist"
    _shard(sources, out)
    keep = _write(out / "shards" / "README.txt", b"not ours")
    _write(sources["over.bin"], os.urandom(LIMIT + 1))
    m = _shard(sources, out)
    on_disk = {f"shards/{p.name}" for p in (out / "shards").glob("*.bin")}
    assert on_disk == {s["path"] for s in m["shards"]}
    assert keep.exists()
    assert verify_manifest(out) == []


def test_verify_detects_corruption_missing_and_edits(sources, tmp_path):
    out = tmp_path / "dist"
    m = _shard(sources, out)
    assert verify_manifest(out) == []
    victim = out / m["files"]["over.bin"]["parts"][0]["shard"]
    data = bytearray(victim.read_bytes())
    data[10] ^= 0xFF  # same size, one flipped byte
    victim.write_bytes(bytes(data))
    problems = verify_manifest(out)
    assert len(problems) == 1 and victim.name in problems[0] and "sha256" in problems[0]
    victim.unlink()
    assert any("missing" in p for p in verify_manifest(out))


def test_verify_detects_hand_edited_manifest(sources, tmp_path):
    out = tmp_path / "dist"
    m = _shard(sources, out)
    m["files"]["one.bin"]["size"] = 2
    (out / "manifest.json").write_text(json.dumps(m))
    problems = verify_manifest(out)
    assert any("version hash" in p for p in problems)
    assert any("one.bin: parts add up to 1" in p for p in problems)
    (out / "manifest.json").write_text('{"format": "webbuild-manifest", "format_version": 1}')
    assert "malformed" in verify_manifest(out)[0]


@pytest.mark.parametrize("kw, match", [
    (dict(max_bytes=0), "max_bytes"),
    (dict(model_id="../x"), "model_id"),
    (dict(variants={"fp16": {"files": ["nope.onnx"]}}), "nope.onnx"),
    (dict(variants={"fp16": ["one.bin"]}), "fp16"),
])
def test_bad_arguments(sources, tmp_path, kw, match):
    with pytest.raises(BuildError, match=match):
        _shard(sources, tmp_path / "dist", **kw)


def test_missing_source_names_file(tmp_path):
    with pytest.raises(BuildError, match="decoder.onnx.*does not exist"):
        _shard({"decoder.onnx": tmp_path / "absent"}, tmp_path / "dist")
    with pytest.raises(BuildError, match="relative name"):
        _shard({"/etc/passwd": tmp_path}, tmp_path / "dist")


def test_refuses_files_a_browser_cannot_hold(tmp_path):
    huge = tmp_path / "decoder_weights.data"
    with huge.open("wb") as f:
        f.truncate(2**31)  # sparse: no disk, no time
    with pytest.raises(BuildError, match=r"decoder_weights.data: 2.00 GiB is more than a browser can hold"):
        _shard({"decoder_weights.data": huge}, tmp_path / "dist")
    assert not (tmp_path / "dist").exists()  # refused before writing anything


def test_default_limit_is_25_mib():
    assert DEFAULT_MAX_BYTES == 26214400


def test_command_line(sources, tmp_path):
    out = tmp_path / "dist"
    args = [f"{n}={p}" for n, p in sources.items()]
    r = subprocess.run([sys.executable, "-m", "webbuild.pipeline.shard", str(out), *args, "--model-id", "m",
                        "--max-bytes", str(LIMIT), "--variant", "all=one.bin,over.bin"],
                       capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert r.returncode == 0, r.stderr
    assert load_manifest(out)["variants"] == {"all": {"files": ["one.bin", "over.bin"]}}
    assert verify_manifest(out) == []
    r = subprocess.run([sys.executable, "-m", "webbuild.pipeline.shard", str(out), "x=/nonexistent", "--model-id", "m"],
                       capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert r.returncode == 2 and "x: source /nonexistent does not exist" in r.stderr


def test_streams_without_holding_files_in_memory(tmp_path):
    import tracemalloc

    big = tmp_path / "big.data"
    with big.open("wb") as f:
        for _ in range(48):
            f.write(os.urandom(1 << 20))
    tracemalloc.start()
    m = _shard({"big.data": big}, tmp_path / "dist", max_bytes=16 << 20)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(m["shards"]) == 3
    assert peak < 4 << 20, f"peak Python allocation {peak} bytes while sharding 48 MiB"
    assert verify_manifest(tmp_path / "dist") == []

"""docs/model-yaml.md is the reference rendered from the model.yaml schema, and it names every key."""

from __future__ import annotations

from pathlib import Path

from webbuild.config import BuildConfig
from webbuild.config_reference import COMMAND, field_rows, render_reference

DOC = Path(__file__).resolve().parents[1] / "docs" / "model-yaml.md"


def test_committed_reference_equals_the_rendered_one():
    assert DOC.read_text() == render_reference(), f"docs/model-yaml.md is stale; regenerate it: {COMMAND}"


def test_every_key_has_a_description():
    missing = [key for key, *_, description in field_rows(BuildConfig) if not description]
    assert not missing, f"fields without Field(description=...) in webbuild/config.py: {', '.join(missing)}"


def test_nested_keys_and_constraints_are_listed():
    rows = {key: (kind, default, allowed) for key, kind, default, allowed, _ in field_rows(BuildConfig)}
    assert rows["source.layout"] == ("string", "required", "`qwen3-asr-split`, `merged`, `qwen3-asr-v2`")
    assert rows["shard.max_bytes"] == ("integer", "`26214400`", ">= 1048576")
    assert rows["site.samples[].text"] == ("string", "required", "length >= 1")
    assert rows["variants"] == ("list of strings", "`[fp16, fp32]`", "`fp16`, `fp32`, length >= 1")
    assert "config_path" not in rows  # set by the loader, not written in model.yaml
    # a number for every provider, or a mapping of them: the type says both, the providers are listed
    assert rows["verify.min_decode_tokens_per_s"] == ("mapping or number", "", "")
    assert rows["verify.min_decode_tokens_per_s.wasm"] == ("number or null", "`null`", "> 0")

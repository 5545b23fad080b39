"""The embedded example model really transcribes its sample clips (Python reference)."""

from __future__ import annotations

import json

import pytest

from tests.command import webbuild
from tests.example_config import EXAMPLE, example_config, write_example_config
from webbuild.config import load_config
from webbuild.pipeline.check import SHARED_ROLES
from webbuild.reference.audio import read_wav
from webbuild.reference.mel import lead_samples
from webbuild.reference.transcribe import load_transcriber


@pytest.fixture(scope="module")
def example():
    cfg = load_config(EXAMPLE / "model.yaml")
    return cfg, load_transcriber(cfg.source.dir, lead=lead_samples(cfg.encoder.lead_ms))  # as the build's front-end


def test_example_config_names_its_samples(example):
    cfg, _ = example
    assert len(cfg.site.samples) >= 3
    for sample in cfg.site.samples:
        assert sample.audio.with_suffix(".txt").read_text().strip() == sample.text


def test_samples_transcribe_exactly(example):
    cfg, runner = example
    for sample in cfg.site.samples:
        assert runner.transcribe(read_wav(sample.audio)) == sample.text


def test_decode_gives_each_token_its_margin(example):
    """decode is generate with margins: the same tokens, each with its lead over the runner-up (logits),
    which `webbuild verify` compares with the page's (webbuild/tools/verify/tokens.py)."""
    cfg, runner = example
    for sample in cfg.site.samples:
        pcm = read_wav(sample.audio)
        decoded = runner.decode(pcm)
        assert decoded.tokens == runner.generate(pcm) and runner.text(decoded.tokens) == sample.text
        assert len(decoded.margins) == len(decoded.tokens) and all(m > 0.1 for m in decoded.margins)


def test_example_stays_small():
    size = sum(p.stat().st_size for p in EXAMPLE.rglob("*") if p.is_file())
    assert size < 30 * 1024 * 1024


@pytest.fixture(scope="module")
def built_example(example_dist):
    """(the example's configuration, its build, the build's report)"""
    report = json.loads((example_dist / "build-report.json").read_text())
    return load_config(EXAMPLE / "model.yaml"), example_dist, report


@pytest.mark.parametrize("variant", ["fp32", "fp16"])
def test_built_variants_transcribe_the_samples(built_example, variant):
    """The Python reference on the site's own int4 graphs, reassembled from its shards."""
    cfg, dist, report = built_example
    runner = load_transcriber(dist, variant)
    for sample in cfg.site.samples:
        assert runner.transcribe(read_wav(sample.audio)) == sample.text
    assert report["variants"][variant]["check"]["mean_token_agreement"] == 1.0


def test_every_shipped_graph_role_has_a_check_row(built_example):
    """The check stage runs every graph the site ships (CPU forms where onnxruntime CPU refuses the WebGPU
    one): a row per role, each against the source, or against its base role for the adapted decoder's (its delta
    graph against the Python reference; the shared-weights forms, compared with their graphs as graphs)."""
    _, dist, report = built_example
    manifest = json.loads((dist / "model" / "manifest.json").read_text())
    for variant, entry in manifest["variants"].items():
        graphs = {role for role, name in entry.items() if isinstance(name, str) and name.endswith(".onnx")}
        rows = report["variants"][variant]["check"]["roles"]
        assert set(rows) == graphs and {"decoder", "decoder_step", "decoder_lora", *SHARED_ROLES} <= graphs
        assert rows["decoder"]["ran"] == "cpu form" and rows["decoder"]["file"] == entry["decoder"]
        for role, row in rows.items():
            # the adapted forms', the delta graph's, the shared-weights forms'
            equal = row.get("tokens_equal", row.get("values_equal"))
            compared = role.startswith("decoder_lora") or role in SHARED_ROLES
            assert equal if compared else row["mean_token_agreement"] == 1.0, (role, row)


def test_built_site_ships_no_float_embedding_table(built_example):
    _, dist, _ = built_example
    manifest = json.loads((dist / "model" / "manifest.json").read_text())
    assert not [name for name in manifest["files"] if "embed_tokens" in name]
    assert all(size <= cfg_limit() for size in (p.stat().st_size for p in dist.rglob("*") if p.is_file()))


def cfg_limit() -> int:
    return load_config(EXAMPLE / "model.yaml").shard.max_bytes


def test_cli_transcribes_a_built_site(built_example):
    from click.testing import CliRunner

    from webbuild.cli import main

    cfg, dist, _ = built_example
    sample = cfg.site.samples[0]
    result = CliRunner().invoke(main, ["transcribe", str(dist), str(sample.audio)])
    assert result.exit_code == 0, result.output
    assert result.stdout.split("\t")[:2] == [str(sample.audio), sample.text]
    assert "WER 0.00% over 1 clip\n" in result.stderr  # sample-1.txt beside the clip


# keyed by names in the data
DATA_KEYS = ("graphs", "variants", "ops", "transcripts", "token_agreement", "samples", "files")


def test_build_report_names_every_graph_census_the_same_way(built_example):
    """A graph is {"nodes", "ops"} wherever it appears (graphs.<name>.source / .fused, variants.<v>.decoder);
    sizes are "bytes" or end in _bytes; no key says before/after or prefixes a graph's name."""
    import re

    _, _, report = built_example

    def walk(node, parent: str = ""):
        if isinstance(node, dict):
            if "ops" in node:
                assert node["nodes"] == sum(node["ops"].values()), parent
                assert all(isinstance(n, int) for n in node["ops"].values()), parent
            for key, value in node.items():
                if parent not in DATA_KEYS:  # a key the report names, not a graph, op or file name
                    assert re.fullmatch(r"[a-z][a-z0-9_]*", key), key
                    assert not re.search(r"_(before|after|ops|nodes)$|^(de|en)coder_(ops|nodes|bytes)", key), key
                    assert "bytes" not in key or key == "bytes" or key.endswith("_bytes"), key
                walk(value, key)
        elif isinstance(node, list):
            for item in node:
                walk(item, parent)

    walk(report)
    assert {k for g in report["graphs"].values() for k in g} == {"source", "fused", "not_fused"}
    assert report["graphs"]["decoder"]["not_fused"] == report["graphs"]["encoder"]["not_fused"] == []
    assert set(report["graphs"]["decoder"]["fused"]) == {"nodes", "ops"}
    for variant in report["variants"].values():
        assert set(variant["decoder"]) == {"bytes", "nodes", "ops"} and set(variant["encoder"]) == {"bytes"}


def test_a_float_build_is_one_the_cli_transcribes(tmp_path):
    """quantize.method none: float weights, the decoder taking embeddings (the page and the reference look the
    tokens up in the shipped table), built and a sample transcribed by the CLI on the site (one sample, the
    Russian one: the build checks each sample on each variant). hqq's build path: tests/test_quantize_matmuls.py,
    weights left on disk."""
    cfg = example_config()
    sample = cfg["site"]["samples"][2]
    config = write_example_config(tmp_path, adapters=[], quantize={"method": "none"}, encoder={"precision": "fp32"},
                                  site={**cfg["site"], "samples": [sample]})
    run = webbuild(config, "-o", tmp_path / "dist")
    assert run.returncode == 0, run.stderr
    manifest = json.loads((tmp_path / "dist" / "model" / "manifest.json").read_text())
    assert list(manifest["variants"]) == ["fp32"] and "embed" in manifest["variants"]["fp32"]
    run = webbuild("transcribe", tmp_path / "dist", EXAMPLE / sample["audio"], "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["text"] == sample["text"]

"""RoPE caches: rebuilt from the graph's inv_freq, then checked against the source's own cos/sin
subgraph evaluated on onnxruntime at both ends of the cache."""

import numpy as np

from webbuild.fusion import cleanup, gqa, rms_norm, rope
from webbuild.fusion.fuse_decoder import load_source
from webbuild.fusion.rule_report import Report


def _first_attention(path):
    model, _ = load_source(path)
    cleanup.apply(model)
    rms_norm.RULE.apply(model, Report())
    sm = next(n for n in model.graph if n.op_type == "Softmax")
    return model, gqa.match(sm)


def test_caches_agree_with_source_subgraph(source):
    _, _, path = source
    _, m = _first_attention(path)
    tables = rope.caches(m.rope.cos, m.rope.sin, m.head_dim, 2048)
    assert not isinstance(tables, str)
    err = rope.verify(m.rope.cos, m.rope.sin, tables)
    assert isinstance(err, float) and err < 1e-6


def test_wrong_caches_are_caught(zoo):
    _, m = _first_attention(zoo.source("merged", "torchscript"))
    cos, sin = rope.caches(m.rope.cos, m.rope.sin, m.head_dim, 2048)
    shifted = (np.roll(cos, 1, axis=0), sin)  # off by one position
    assert rope.verify(m.rope.cos, m.rope.sin, shifted) > 1e-2


def test_fusion_refuses_caches_that_do_not_match(zoo, monkeypatch):
    """If the rebuilt tables disagree with the source, GQA does not take them: the RoPE stays as the source
    computes it and GQA is given Q and K rotated (do_rotary=0, no caches)."""
    real = rope.caches
    monkeypatch.setattr(rope, "caches", lambda *a: tuple(t * 1.01 for t in real(*a)))
    model, _ = load_source(zoo.source("merged", "torchscript"))
    cleanup.apply(model)
    report = Report()
    rms_norm.RULE.apply(model, report)
    hits = gqa.rule(2048).apply(model, report)
    assert hits == sum(n.op_type == "GroupQueryAttention" for n in model.graph) > 0 and not report.missed
    assert any("RoPE left as the source computes it" in note and "differ from the source" in note
               for note in report.notes)
    assert all(n.attributes["do_rotary"].value == 0 for n in model.graph if n.op_type == "GroupQueryAttention")
    assert not any(name.startswith("cos_cache") for name in model.graph.initializers)

"""The fusion table of BENCHMARKS.md: every exporter x family x precision the fusion tests fuse, with node
counts before and after, the fused ops, CPU parity and --strict. Uses (and makes, when missing) the tests'
cached fixtures: the Optimum exports (exporters.py), their fp16 / q4f16 conversions (fp16_export.py) and
the torch.onnx dynamo SDPA exports (test_sources.py), and the hand-built static KV cache written by ScatterND in
each of its shapes (static_cache_graph.py), driven on static buffers.

    PYTHONPATH=. python -m tests.fusion.fusion_table    # prints the markdown table
    PYTHONPATH=. python -m tests.fusion.fusion_table dynamo|static    # those rows alone
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from webbuild.fusion import parity
from webbuild.fusion.fuse_decoder import fuse_decoder, save
from webbuild.fusion.parity import compare_tokens
from webbuild.fusion.rule_report import strict_failures

SHOWN = ("GroupQueryAttention", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization",
         "LayerNormalization", "SkipLayerNormalization", "MatMulNBits")
SHORT = {"GroupQueryAttention": "GQA", "SimplifiedLayerNormalization": "SLN",
         "SkipSimplifiedLayerNormalization": "SkipSLN", "LayerNormalization": "LN", "SkipLayerNormalization": "SkipLN",
         "MatMulNBits": "MatMulNBits"}


def sources(only: str = "") -> list[tuple[str, str, str, Path, int]]:
    """(exporter, family, precision, decoder .onnx, vocabulary size)."""
    from tests.fusion.exporters import FAMILIES, export
    from tests.fusion.fp16_export import converted

    if only == "dynamo":
        return _dynamo()
    if only == "static":
        return _static()
    out = []
    for family in FAMILIES:
        src = export(family)
        out.append(("Optimum", family, "fp32", src / "model.onnx", _vocab(src)))
    for family, kind in (("llama", "fp16"), ("qwen3", "fp16"), ("glm", "fp16"), ("gemma3", "fp16"),
                         ("llama", "q4f16"), ("qwen3", "q4f16"), ("smollm3", "q4f16"), ("llama", "q8")):
        src = converted(family, kind)
        how = "dynamic int8 quantization" if kind == "q8" else "float16 converter"
        out.append((f"Optimum + {how}", family, kind, src / "model.onnx", _vocab(src)))
    out += _dynamo()
    return out + _static()


def _vocab(src: Path) -> int:
    return int(json.loads((src / "config.json").read_text())["vocab_size"])


def _dynamo() -> list[tuple[str, str, str, Path, int]]:
    from tests.conftest import Zoo, zoo_key
    from tests.fusion.dynamo_export import CASES, cached
    from tests.fusion.exporters import cache_root
    from tests.fusion.sources import FAMILY_DIMS, dynamo_sdpa

    zoo = Zoo(cache_root() / "zoo" / zoo_key())
    rows = [(f"torch.onnx dynamo, SDPA, opset {opset}", family, "fp32",
             dynamo_sdpa(zoo, family, opset) / "decoder_model_merged.onnx", int(FAMILY_DIMS["vocab_size"]))
            for opset in (20, 23) for family in ("llama", "qwen3")]
    for family, attention, opset in CASES:
        src = cached(zoo, family, attention, opset)
        rows.append((f"torch.onnx dynamo, HF {attention}, opset {opset}", family, "fp32", src / "model.onnx",
                     _vocab(src)))
    return rows


def _static() -> list[tuple[str, str, str, Path, int]]:
    """The static-cache fixture in each of its shapes, written (in milliseconds) under the tests' cache."""
    import onnx_ir as ir

    from tests.fusion.exporters import cache_root
    from tests.fusion.static_cache_graph import SHAPES, static_decoder

    rows = []
    for shape, dims in SHAPES.items():
        path = cache_root() / "static-cache" / shape / "decoder.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        ir.save(static_decoder(dims), path)
        rows.append(("hand-built static KV cache (ScatterND, WebNN's form)", shape, "fp32", path, dims.vocab))
    return rows


def _static_parity(src: Path, fused: Path, vocab: int) -> dict:
    """Greedy decoding on the same static buffers (a random embedding table; different stale slots each side)."""
    source = parity.StaticRunner(src)
    hidden = source.sess.get_inputs()[0].shape[-1]
    table = np.random.default_rng(0).standard_normal((vocab, hidden)).astype(np.float32)
    return parity.compare(source, parity.StaticRunner(fused, stale=1), table, prefill=10, steps=16)


def row(exporter: str, family: str, precision: str, path: Path, vocab: int) -> str:
    model, report = fuse_decoder(path)
    with tempfile.TemporaryDirectory() as tmp:
        out = save(model, Path(tmp))
        if report["static_kv"]:
            r = _static_parity(path, out, vocab)
        elif (path.parent / "embed_tokens.bin").is_file():  # a decoder taking inputs_embeds
            r = parity.compare(parity.source_runner(path), parity.MergedRunner(out), parity.embed_table(path.parent),
                               steps=16)
        else:
            r = compare_tokens(path, out, vocab, prefill=10, steps=16)
    ops = report["ops_after"]
    fused = ", ".join(f"{ops[op]} {SHORT[op]}" for op in SHOWN if op in ops)
    strict = strict_failures({"decoder": {"not_fused": report["not_fused"], "ops": ops,
                                          "left_over": report["left_over"]}})
    return (f"| {exporter} | {family} | {precision} | {report['nodes_before']:,} | {report['nodes_after']:,} | "
            f"{fused} | {r['max_rel_err']:.1e} | {'yes' if r['tokens_equal'] else 'no'} | "
            f"{'green' if not strict else '; '.join(strict)} |")


def main(only: str = "") -> None:
    """The table; `only` "dynamo" or "static": those rows alone."""
    print("| exporter | family | precision | nodes before | nodes after | fused ops | max logit error / range "
          "| greedy tokens equal (16 steps) | --strict |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for source in sources(only):
        print(row(*source), flush=True)


if __name__ == "__main__":
    import sys

    main(*sys.argv[1:])

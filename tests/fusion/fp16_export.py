"""fp16, q4f16 and q8 decoders as transformers.js publishes them: an Optimum export (exporters.py) converted by
onnxruntime's float16 converter, after int4 MatMulNBits quantization (block 32, symmetric) for q4f16; for q8
onnxruntime's dynamic quantization (int8 MatMulInteger weights, activations quantized at run time).
Made with this venv's onnxruntime (no torch) and cached, keyed by the Optimum export's folder (itself keyed
by the exporter's pins), this file and onnxruntime's version."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from tests.fusion.exporters import cache_root, export, made_once

KINDS = ("fp16", "q4f16", "q8")


def converted(family: str, kind: str) -> Path:
    """`family`'s Optimum export in `kind`: a folder with model.onnx and the export's config.json."""
    import onnxruntime

    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
    src = export(family)
    key = hashlib.sha256(b"\0".join([str(src).encode(), Path(__file__).read_bytes(),
                                     onnxruntime.__version__.encode()])).hexdigest()[:16]
    out = cache_root() / "fp16-fixtures" / key / f"{family}-{kind}"
    return made_once(out, lambda folder: _convert(src, folder, kind), "model.onnx")


def _convert(src: Path, out: Path, kind: str) -> None:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    out.mkdir()
    if kind == "q8":  # transformers.js's "quantized": int8 weights, activations quantized at run time
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(src / "model.onnx", out / "model.onnx", weight_type=QuantType.QInt8)
        shutil.copy(src / "config.json", out / "config.json")
        return
    model = onnx.load(src / "model.onnx")
    if kind == "q4f16":
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        q = MatMulNBitsQuantizer(model, block_size=32, is_symmetric=True)
        q.process()
        model = q.model.model
    # as transformers.js ships them: the past KV inputs, the presents and the logits fp16 too
    model = convert_float_to_float16(model, keep_io_types=False)
    onnx.save(model, out / "model.onnx")
    shutil.copy(src / "config.json", out / "config.json")


if __name__ == "__main__":
    import sys

    print(converted(*sys.argv[1:]))

"""The int4 variant of an export, as published Qwen3-ASR exports ship one: every decoder MatMul
with constant weights becomes MatMulNBits (symmetric, block 64 by default) through onnxruntime's
quantizer, nothing else changes. It is the speed baseline of `webbuild bench` and a fusion source
(graphs that arrive already quantized with another block size).

    python -m webbuild.zoo.published_int4 SRC_DIR OUT_DIR [--block-size 64]
"""

from __future__ import annotations

import argparse
import logging
import shutil
from pathlib import Path

import onnx

DECODERS = ("decoder_model_merged.onnx", "decoder_init.onnx", "decoder_step.onnx")


def quantize_export(src_dir: Path, out: Path, block_size: int = 64, accuracy_level: int = 4) -> Path:
    """A copy of `src_dir` whose decoders are int4 MatMulNBits; each decoder gets its own data file
    (<graph>.data), every other file (encoder, tables, configs) is copied as is. Accuracy level 4 lets
    kernels round activations to int8 (as WebGPU's do); 0 keeps them float (exact CPU parity)."""
    src_dir, out = Path(src_dir), Path(out)
    data_files = {str(t.external_data[0].value) for name in DECODERS if (src_dir / name).is_file()
                  for t in onnx.load(str(src_dir / name), load_external_data=False).graph.initializer
                  if t.external_data}
    out.mkdir(parents=True)
    for f in sorted(src_dir.iterdir()):
        if f.name in DECODERS:
            model = quantize_graph(onnx.load(str(f), load_external_data=True), block_size, accuracy_level)
            onnx.save(model, str(out / f.name), save_as_external_data=True, location=f"{f.name}.data")
        elif f.is_file() and f.name not in data_files:
            shutil.copy(f, out / f.name)
    return out


def quantize_graph(model: onnx.ModelProto, block_size: int, accuracy_level: int) -> onnx.ModelProto:
    """`model` (weights loaded) with every constant-weight MatMul as 4-bit symmetric MatMulNBits."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    q = MatMulNBitsQuantizer(model, bits=4, block_size=block_size, is_symmetric=True, accuracy_level=accuracy_level)
    q.process()
    return q.model.model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--block-size", type=int, default=64)
    a = ap.parse_args()
    print(quantize_export(a.src, a.out, a.block_size))


if __name__ == "__main__":
    main()

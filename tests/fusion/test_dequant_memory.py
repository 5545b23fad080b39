"""`webbuild fuse` on a decomposed lookup whose table is 1.16 GiB once dequantized (151,936 x 2,048, the
Qwen vocabulary) never builds that float table: its peak RSS stays within half of it over the same
command on a small table.

Peak RSS is the fuse process's own VmHWM (Linux), read as it exits: ru_maxrss (the report's
peak_rss_mib) of a process started from this one counts this process's peak too, as Linux carries
it across fork and exec."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx_ir as ir

ROOT = Path(__file__).resolve().parents[2]
VOCAB, HIDDEN, BLOCK = 151_936, 2048, 32


def decomposed_lookup(folder: Path, vocab: int = VOCAB, hidden: int = HIDDEN, block: int = BLOCK,
                      dtype: ir.DataType = ir.DataType.INT4) -> Path:
    """folder/model.onnx(.data): ids -> Gather(DequantizeLinear(table [V, H] int4, axis 1)) -> embeds, and
    the same table tied to lm_head (Transpose + MatMul) -> logits, as the WebNN EP writes it; random
    codes, external data. Returns the model's path."""
    rng = np.random.default_rng(0)
    nbytes = vocab * hidden * dtype.bitwidth // 8
    codes = ir.PackedTensor(rng.integers(0, 256, nbytes, dtype=np.uint8), dtype, shape=[vocab, hidden], name="table")
    scale = ir.tensor((rng.random((vocab, hidden // block)) * 0.01).astype(np.float32), name="scale")
    q, s = (ir.Value(name=t.name, shape=ir.Shape(t.shape), type=ir.TensorType(t.dtype), const_value=t)
            for t in (codes, scale))
    ids = ir.Value(name="ids", shape=ir.Shape([1, "seq"]), type=ir.TensorType(ir.DataType.INT64))
    x = ir.Value(name="hidden", shape=ir.Shape([1, 1, hidden]), type=ir.TensorType(ir.DataType.FLOAT))
    dq = ir.node("DequantizeLinear", [q, s], {"axis": 1, "block_size": block})
    gather = ir.node("Gather", [dq.outputs[0], ids], {"axis": 0})
    transpose = ir.node("Transpose", [dq.outputs[0]], {"perm": [1, 0]})
    lm_head = ir.node("MatMul", [x, transpose.outputs[0]])
    outputs = ((gather.outputs[0], "embeds", [1, "seq", hidden]), (lm_head.outputs[0], "logits", [1, 1, vocab]))
    for v, name, shape in outputs:
        v.name, v.shape, v.type = name, ir.Shape(shape), ir.TensorType(ir.DataType.FLOAT)
    graph = ir.Graph([ids, x], [gather.outputs[0], lm_head.outputs[0]], nodes=[dq, gather, transpose, lm_head],
                     initializers=[q, s], opset_imports={"": 21}, name="decomposed_lookup")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    ir.save(ir.Model(graph, ir_version=10), path, external_data="model.onnx.data")
    return path


_FUSE = """
import sys
from webbuild.cli import main
try:
    main(sys.argv[1:], prog_name="webbuild")
finally:
    print(next(line for line in open("/proc/self/status") if line.startswith("VmHWM:")).split()[1])
"""


def fuse_peak_rss_mib(model: Path, out: Path) -> tuple[float, dict]:
    """(peak RSS in MiB, report) of `webbuild fuse MODEL -o OUT --no-quantize` in its own process."""
    report = out / "report.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _FUSE, "fuse", str(model), "-o", str(out), "--no-quantize",
                           "--report", str(report)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1]) / 1024, json.loads(report.read_text())


def test_fusing_a_large_table_never_dequantizes_it(tmp_path):
    small, _ = fuse_peak_rss_mib(decomposed_lookup(tmp_path / "small", vocab=1024), tmp_path / "small_out")
    peak, rep = fuse_peak_rss_mib(decomposed_lookup(tmp_path / "large"), tmp_path / "large_out")
    assert rep["fused"] == {"gather_block_quantized": 1, "matmul_nbits": 1} and rep["not_fused"] == []
    dequantized_mib = VOCAB * HIDDEN * 4 / 2**20  # 1188 MiB as float32
    packed_mib = VOCAB * HIDDEN / 2 / 2**20  # 148 MiB of int4 codes
    print(f"peak RSS {peak:.0f} MiB, {small:.0f} MiB for a 1024-row table: +{peak - small:.0f} MiB "
          f"for a table of {packed_mib:.0f} MiB packed, {dequantized_mib:.0f} MiB dequantized")
    assert peak - small < 0.5 * dequantized_mib

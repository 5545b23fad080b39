"""Does a variant's wasm path fit a browser tab? An estimate of onnxruntime-web's wasm memory.

onnxruntime-web's wasm build is wasm32: one linear memory of at most 4 GiB holds everything the two
sessions (encoder and decoder) keep. A variant whose wasm graphs need more fails at session creation
with `std::bad_alloc` (the fp32 0.6b does: issue 17). The build estimates the need from the graphs it
ships for the wasm EP (the twins where there are, else the graphs themselves), reading initializer
sizes from the graph protos, never the weights, and counts:

- the model bytes passed in: each graph's proto and its external data file, copied into the heap;
- the initializers as onnxruntime's tensors: a second copy of every stored initializer;
- what a twin folds: each MatMulNBits of the graph that its twin spells in standard ops
  (webbuild.quantize.wasm_twin) becomes a float32 K x N weight at session creation, and the folding
  costs far more than that float weight: every step of the dequantization (int32 nibbles, their
  pairs, the float codes, the scaled blocks, the transposed weight) is folded into a constant of its
  own, kept as the graph's initializer and as onnxruntime's tensor. Measured in Node (onnxruntime-web
  1.30 wasm, one thread): twins of 1, 2, 4, 8 int4 1024 x 3072 weights (12 MiB each as float32) grow the
  heap to 184, 318, 756, 1410 MiB, and 32 of them (384 MiB as float32) end in std::bad_alloc: about
  FOLD_FACTOR times the float32 size, cumulative;
- the decoder's KV cache at runtime.json's `max_positions`, past and present alive together (float32);
- an activation allowance: a fixed arena (256 MiB) plus, per position of a full-length prefill, the
  hidden states, MLP and attention scores of one layer, several times over.

It is an estimate, deliberately generous (copies onnxruntime may free after session creation are
counted as kept), not a measurement: tests/test_wasm_budget.py compares it with the heap of a real
onnxruntime-web wasm session in Node for the tiny example. A variant whose estimate exceeds the budget
(4 GiB less a margin) gets no wasm path: the manifest entry's `wasm.fits` is false and the page says
the model needs WebGPU (webbuild/template/runtime/site.js).
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx

from webbuild.graph.load import load_onnx
from webbuild.quantize.wasm_twin import WASM_FLOAT_WEIGHTS_MAX

GIB = 1 << 30
WASM_MEMORY = 4 * GIB  # wasm32's address space: all a wasm page gets
MARGIN = GIB // 4  # onnxruntime's own code, stacks, the allocator's fragmentation
BUDGET = WASM_MEMORY - MARGIN
ARENA = 128 << 20  # activation allowance independent of the sequence length
FOLD_FACTOR = 14  # heap bytes per float32 byte a twin folds (measured: see above)
BUDGET_ENV = "WEBBUILD_WASM_BUDGET_BYTES"  # a smaller budget, for tests of the refusal only


def budget_bytes() -> int:
    return int(os.environ.get(BUDGET_ENV) or BUDGET)


def _tensor_bytes(t: onnx.TensorProto) -> int:
    n = 1
    for d in t.dims:
        n *= d
    item = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.FLOAT16: 2, onnx.TensorProto.UINT8: 1,
            onnx.TensorProto.INT8: 1, onnx.TensorProto.INT64: 8, onnx.TensorProto.INT32: 4,
            onnx.TensorProto.DOUBLE: 8, onnx.TensorProto.BFLOAT16: 2}.get(t.data_type, 4)
    return n * item


def _matmul_nbits_floats(model: onnx.ModelProto) -> int:
    """float32 bytes of every MatMulNBits weight in `model` (K x N each)."""
    total = 0
    for n in model.graph.node:
        if n.op_type == "MatMulNBits":
            a = {x.name: x.i for x in n.attribute}
            total += 4 * a["K"] * a["N"]
    return total


def graph_need(folder: Path, graph: str, twin: str | None) -> dict:
    """The estimated bytes of one graph's wasm session: `twin` (else `graph`) is what the wasm EP runs."""
    shipped = folder / (twin or graph)
    model = load_onnx(shipped)
    data = {i.value for t in model.graph.initializer for i in t.external_data if i.key == "location"}
    file_bytes = shipped.stat().st_size + sum((folder / d).stat().st_size for d in data)
    tensors = sum(_tensor_bytes(t) for t in model.graph.initializer)
    folded = 0
    if twin:  # what the twin no longer runs as MatMulNBits, onnxruntime folds to float32
        folded = _matmul_nbits_floats(load_onnx(folder / graph)) - \
            _matmul_nbits_floats(model)
    return {"model_bytes": file_bytes, "tensor_bytes": tensors, "folded_bytes": FOLD_FACTOR * folded}


def runtime_need(runtime: dict, intermediate: int | None = None, heads: int | None = None) -> dict:
    """KV cache and activations of a decoder described by runtime.json at its `max_positions`."""
    d = runtime["decoder"]
    positions = runtime.get("max_positions") or (runtime.get("prompt_tokens", 0) + runtime["max_new_tokens"])
    kv = 2 * 2 * d["num_layers"] * d["num_key_value_heads"] * d["head_dim"] * positions * 4  # k+v, past+present
    hidden = d["hidden_size"]
    inter = intermediate or 3 * hidden
    q_heads = heads or 2 * d["num_key_value_heads"]
    per_position = (8 * hidden + 3 * inter + q_heads * positions) * 4
    return {"kv_cache_bytes": kv, "activation_bytes": ARENA + 4 * positions * per_position,
            "max_positions": positions}


def variant_need(folder: Path, files: dict[str, str], runtime: dict) -> dict:
    """The wasm estimate of one variant (its files by role, as the manifest entry), with the budget."""
    parts = {"model_bytes": 0, "tensor_bytes": 0, "folded_bytes": 0}
    for graph in ("encoder", "decoder"):
        if files.get(graph):
            for k, v in graph_need(folder, files[graph], files.get(f"{graph}_wasm")).items():
                parts[k] += v
    parts |= runtime_need(runtime)
    return judge(parts)


def judge(parts: dict) -> dict:
    need = sum(v for k, v in parts.items() if k.endswith("_bytes"))
    budget = budget_bytes()
    out = {"need_bytes": need, "budget_bytes": budget, "fits": need <= budget, **parts}
    if need > budget:
        out["why"] = (f"its WebAssembly fallback needs {need / GIB:.1f} GiB, more than the "
                      f"{budget / GIB:.1f} GiB a browser tab gets")
    return out


def shapes_need(*, layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int,
                vocab: int, enc_layers: int, enc_dim: int, enc_ffn: int, max_positions: int) -> dict:
    """The same estimate from a model's dimensions, without building it: every linear weight int4 on the
    wire and folded to float32 by the twins, the embedding int4 and looked up in place; biases, norms
    and the encoder's convolutions left out (small beside the linears). A graph's weights are folded only
    within webbuild.quantize.wasm_twin's WASM_FLOAT_WEIGHTS_MAX, as the twins are made."""
    dec_linear = layers * (hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
                           + heads * head_dim * hidden + 3 * hidden * intermediate) + vocab * hidden
    enc_linear = enc_layers * (4 * enc_dim * enc_dim + 2 * enc_dim * enc_ffn)
    int4 = (dec_linear + enc_linear + vocab * hidden) * 5 // 8  # 4 bits + a float32 scale per 32
    folded = sum(4 * n for n in (dec_linear, enc_linear) if 4 * n <= WASM_FLOAT_WEIGHTS_MAX)
    parts = {"model_bytes": int4, "tensor_bytes": int4, "folded_bytes": FOLD_FACTOR * folded}
    parts |= runtime_need({"decoder": {"num_layers": layers, "num_key_value_heads": kv_heads,
                                       "head_dim": head_dim, "hidden_size": hidden},
                           "max_positions": max_positions}, intermediate, heads)
    return judge(parts)

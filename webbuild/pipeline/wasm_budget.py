"""Does a variant's wasm path fit a browser tab? An estimate of onnxruntime-web's wasm memory, and the
choice of the form each graph ships in for the wasm EP.

onnxruntime-web's wasm build is wasm32: one linear memory of at most 4 GiB holds everything the encoder and
decoder sessions keep, and a variant whose wasm graphs need more fails at session creation with
`std::bad_alloc`. Each int4 graph can run on the wasm EP in three forms (webbuild.forms.wasm_twin):

- `int8`: the twin runs each MatMulNBits as DynamicQuantizeMatMul over uint8 weights derived at load from the
  shipped int4 ones: the heap holds K x N bytes a weight, and the derived file while the session is made
  (`int8_bytes`, counted in `model_bytes`);
- `float`: the twin spells every MatMulNBits in standard ops that onnxruntime folds to float32 at session
  creation; every folded step of the dequantization stays as a constant of its own, so the heap grows by about
  FOLD_FACTOR times the float32 size;
- `matmul_nbits`: kept as it is; each run dequantizes the weight into a float32 buffer that the session's arena
  keeps (`scratch_bytes`), and runs slowly.

The estimate reads initializer sizes from the int4 graphs' protos, never the weights. Sessions are created one
after the other and onnxruntime-web frees a session's model bytes once it is made, so the heap peaks either at a
session's creation (the largest graph's model bytes beside every initializer and what the twins fold) or while
transcribing (those tensors, each session's scratch, the KV cache at runtime.json's `max_positions` with past and
present alive together, and an activation allowance); `need_bytes` is the larger (`peak` says which). `plan` tries
every combination of the graphs' forms and takes, among those within the budget (4 GiB less a margin), the one
that leaves the fewest weights to MatMulNBits (`slow_bytes`), then the one that folds the most to float, then the
one needing the least memory; the report lists every option. Where no option fits, the manifest entry's
`wasm.fits` is false and the page says the model needs WebGPU (webbuild/template/runtime/site.js).

The estimate is deliberately generous (copies onnxruntime may free after session creation count as kept);
tests/test_wasm_budget.py holds it against the heap of a real onnxruntime-web wasm session in Node. `tab_bytes`
bounds the tab's peak: the heap's need, plus the largest session's model bytes in JavaScript (onnxruntime-web
copies external data into the heap from them), plus TAB_ALLOWANCE for the renderer and the page. The measured
figures behind FOLD_FACTOR, the scratch and the allowances: BENCHMARKS.md "wasm memory: does the fallback fit a
tab?" and "0.6b on the wasm EP: memory beside the speed".
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import onnx

from webbuild.forms.wasm_twin import foldable, int8_ready
from webbuild.graph.load import load_onnx

GIB = 1 << 30
WASM_MEMORY = 4 * GIB  # wasm32's address space: all a wasm page gets
MARGIN = GIB // 4  # onnxruntime's own code, stacks, the allocator's fragmentation
BUDGET = WASM_MEMORY - MARGIN
ARENA = 128 << 20  # activation allowance independent of the sequence length
FOLD_FACTOR = 14  # heap bytes per float32 byte a twin folds (measured: see above)
BUDGET_ENV = "WEBBUILD_WASM_BUDGET_BYTES"  # a smaller budget, for tests of the choice and the refusal only
# the tab's own beside the heap and the model bytes: the renderer and the page (0.17-0.26 GiB measured above the
# heap after gc()), the loader's held cache copies on wasm (64 MiB, runtime/site.js) and onnxruntime-web's binary
TAB_ALLOWANCE = 384 << 20
PARTS = ("model_bytes", "tensor_bytes", "folded_bytes", "scratch_bytes", "int8_bytes", "slow_bytes")  # per form


def budget_bytes() -> int:
    return int(os.environ.get(BUDGET_ENV) or BUDGET)


def _tensor_bytes(t: onnx.TensorProto) -> int:
    n = 1
    for d in t.dims:
        n *= d
    item: dict[int, int] = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.FLOAT16: 2, onnx.TensorProto.UINT8: 1,
            onnx.TensorProto.INT8: 1, onnx.TensorProto.INT64: 8, onnx.TensorProto.INT32: 4,
            onnx.TensorProto.DOUBLE: 8, onnx.TensorProto.BFLOAT16: 2}
    return n * item.get(t.data_type, 4)


def _matmul_nbits_floats(model: onnx.ModelProto) -> list[int]:
    """float32 bytes of each MatMulNBits weight in `model` (K x N each)."""
    return [4 * k * n for k, n, _, _ in _matmuls(model)]


def _matmuls(model: onnx.ModelProto) -> list[tuple[int, int, int, bool]]:
    """(K, N, bytes of its int4 codes and scales, whether the int8 form takes it) of each MatMulNBits."""
    inits = {t.name: t for t in model.graph.initializer}
    out = []
    for n in model.graph.node:
        if n.op_type == "MatMulNBits":
            a = {x.name: x.i for x in n.attribute}
            stored = sum(_tensor_bytes(inits[x]) for x in n.input[1:3] if x in inits)
            out.append((a["K"], a["N"], stored, int8_ready(n, inits)))
    return out


def form_parts(file_bytes: int, tensor_bytes: int, floats: list[int], can_fold: bool = True,
               int8: list[tuple[int, int]] | None = None, int8_slow: list[int] | None = None) -> dict[str, dict]:
    """The estimated parts of one graph's wasm session in each form it can ship in: `floats` are its
    MatMulNBits weights as float32 bytes; `int8`, per weight the int8 form takes, its uint8 bytes (K x N)
    and the int4 codes' and scales' bytes it replaces; `int8_slow`, the float32 bytes of those it leaves
    MatMulNBits. A graph without any MatMulNBits has one form, `float` (its weights are)."""
    base = {"model_bytes": file_bytes, "tensor_bytes": tensor_bytes, "int8_bytes": 0}
    forms = {}
    if can_fold or not floats:
        forms["float"] = base | {"folded_bytes": FOLD_FACTOR * sum(floats), "scratch_bytes": 0, "slow_bytes": 0}
    if int8:
        derived = sum(b for b, _ in int8)
        slow = int8_slow or []
        forms["int8"] = {"model_bytes": file_bytes + derived, "int8_bytes": derived, "folded_bytes": 0,
                         "tensor_bytes": tensor_bytes + derived - sum(r for _, r in int8),
                         "scratch_bytes": max(slow, default=0), "slow_bytes": sum(slow)}
    if floats:
        forms["matmul_nbits"] = base | {"folded_bytes": 0, "scratch_bytes": max(floats), "slow_bytes": sum(floats)}
    return forms


def graph_forms(path: Path) -> dict[str, dict]:
    """`form_parts` of the graph file `path` (an int4 graph as quantized, before any wasm twin)."""
    model = load_onnx(path)
    data = {i.value for t in model.graph.initializer for i in t.external_data if i.key == "location"}
    file_bytes = path.stat().st_size + sum((path.parent / d).stat().st_size for d in data)
    tensors = sum(_tensor_bytes(t) for t in model.graph.initializer)
    matmuls = _matmuls(model)
    int8 = [(k * n, stored - 4 * n) for k, n, stored, ready in matmuls if ready]  # its column scales stay
    slow = [4 * k * n for k, n, _, ready in matmuls if not ready]
    return form_parts(file_bytes, tensors, [4 * k * n for k, n, _, _ in matmuls], foldable(model), int8, slow)


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


def variant_plan(folder: Path, files: dict[str, str], runtime: dict, decoder_sessions: int = 1) -> dict:
    """The wasm plan of one variant (its int4 graphs by role, as the manifest entry), with the budget.
    `decoder_sessions`: 2 in a build with LoRA adapters, whose adapted decoder session holds the
    decoder's weights a second time (docs/adapters.md)."""
    graphs = {g: graph_forms(folder / files[g]) for g in ("encoder", "decoder") if files.get(g)}
    if "decoder" in graphs:
        graphs["decoder"] = sessions_of(graphs["decoder"], decoder_sessions)
    return plan(graphs, runtime_need(runtime))


def sessions_of(forms: dict[str, dict], sessions: int) -> dict[str, dict]:
    """A graph's form parts when `sessions` sessions of it are alive: each holds its tensors, folds and
    scratch; their model bytes are freed once each is created, so they peak one at a time."""
    return {form: {k: v if k == "model_bytes" else v * sessions for k, v in parts.items()}
            for form, parts in forms.items()}


def plan(graphs: dict[str, dict[str, dict]], runtime_parts: dict) -> dict:
    """Every combination of the graphs' forms, judged against the budget; the chosen one's figures with
    `forms` ({graph: form}) and `options` (each combination's forms, need and fit). The choice: of the
    options that fit, the one leaving the fewest weights to MatMulNBits (the slow kernel on wasm), then the
    one folding the most to float (a float MatMul takes 0.34 ms where the int8 one takes 0.8), then the
    smallest; else (none fits) the smallest, whose `why` the page shows."""
    options = []
    for combo in itertools.product(*(forms.items() for forms in graphs.values())):
        parts = {k: sum(p[k] for _, p in combo) for k in PARTS} | runtime_parts
        parts["model_bytes"] = max(p["model_bytes"] for _, p in combo)  # one session's at a time
        options.append({"forms": dict(zip(graphs, (form for form, _ in combo))), **judge(parts)})
    fitting = [o for o in options if o["fits"]]
    chosen = min(fitting, key=lambda o: (o["slow_bytes"], -o["folded_bytes"], o["need_bytes"])) if fitting else \
        min(options, key=lambda o: o["need_bytes"])
    listed = [{"forms": o["forms"], "need_bytes": o["need_bytes"], "fits": o["fits"]} for o in options]
    return chosen | {"options": listed}


def judge(parts: dict) -> dict:
    """The heap's peak, at a session's creation or while transcribing, against the budget; the tab's (tab_bytes)."""
    kept = parts["tensor_bytes"] + parts["folded_bytes"]
    peaks = {"session creation": kept + parts["model_bytes"],
             "transcription": kept + parts["scratch_bytes"] + parts["kv_cache_bytes"] + parts["activation_bytes"]}
    peak = max(peaks, key=peaks.__getitem__)
    need, budget = peaks[peak], budget_bytes()
    out = {"need_bytes": need, "budget_bytes": budget, "fits": need <= budget, "peak": peak,
           "tab_bytes": need + parts["model_bytes"] + TAB_ALLOWANCE, **parts}
    if need > budget:
        out["why"] = (f"its WebAssembly fallback needs {need / GIB:.1f} GiB, more than the "
                      f"{budget / GIB:.1f} GiB a browser tab gets")
    return out


def shapes_need(*, layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int,
                vocab: int, enc_layers: int, enc_dim: int, enc_ffn: int, max_positions: int,
                decoder_sessions: int = 1) -> dict:
    """The same plan from a model's dimensions, without building it: every linear weight int4 (4 bits and
    a float32 scale per 32) on the wire, the embedding int4 and looked up in place; biases, norms and the
    encoder's convolutions left out (small beside the linears)."""
    q, kv = heads * head_dim, kv_heads * head_dim
    dec = [hidden * q, hidden * kv, hidden * kv, q * hidden, *[hidden * intermediate] * 3]
    enc = [enc_dim * enc_dim] * 4 + [enc_dim * enc_ffn] * 2
    dec_weights, enc_weights = layers * dec + [vocab * hidden], enc_layers * enc

    def forms(weights: list[int], extra: int = 0) -> dict[str, dict]:
        int4 = (sum(weights) + extra) * 5 // 8
        return form_parts(int4, int4, [4 * w for w in weights], int8=[(w, w * 5 // 8) for w in weights])

    decoder = sessions_of(forms(dec_weights, vocab * hidden), decoder_sessions)
    graphs = {"encoder": forms(enc_weights), "decoder": decoder}
    return plan(graphs, runtime_need({"decoder": {"num_layers": layers, "num_key_value_heads": kv_heads,
                                                  "head_dim": head_dim, "hidden_size": hidden},
                                      "max_positions": max_positions}, intermediate, heads))

"""The wasm twin of a quantized graph (decoder or encoder): the same graph and the same weights file,
with the int4 operators that onnxruntime-web's wasm (CPU) build lacks or runs slowly spelt in ops it
runs fast. Each graph's twin has one of three forms (`FORMS`; webbuild.pipeline.wasm_budget picks it):

- GatherBlockQuantized (the int4 or int8 embedding lookup) has no kernel in the 1.30 wasm build: every
  form gathers the packed uint8 rows and unpacks only those.
- MatMulNBits has a kernel there but a slow one: it dequantizes the whole weight to float32 at every
  run, at any accuracy level (10-23 ms for a 1024 x 3072 int4 weight at one token on the 2-core box,
  BENCHMARKS.md "wasm kernels and the int8 form"). `matmul_nbits` keeps it.
- `int8`: each 4-bit symmetric MatMulNBits whose codes and float32 scales lie in the weights file becomes
  DynamicQuantizeMatMul (com.microsoft: the activations quantized to uint8 per tensor, then MLAS's
  WebAssembly SIMD integer GEMM: 0.8 ms for that weight, the float MatMul 0.34 ms) over a uint8
  weight [K, N] with zero point 128 and one float32 scale per output column. The uint8 weights are not
  shipped: they are derived at load from the int4 codes and scales (webbuild.graph.packing.int8_weights,
  runtime/int8.js on the page, both by the same float64 arithmetic, so byte for byte the same) into a weights file of
  their own that the twin names (`Int8Plan.file`) and that no server has; the plan of that derivation is
  a small JSON file beside the twin (`int8_plan_name`). Requantizing block-32 int4 to per-column 8 bits
  costs about 0.7% of the weight's size in error (rms); the uint8 form (not int8) keeps x86's AVX2
  kernel, which onnxruntime CPU runs the Python reference on, from saturating its 16-bit sums.
- `float`: the twin dequantizes each weight with Cast/Div/Mul/Sub/Reshape/Transpose over its packed
  initializer: every input is a constant, so onnxruntime folds it into a float32 weight once, at session
  creation. The folding costs wasm memory many times the float32 weights (webbuild.pipeline.wasm_budget).

Nibbles are unpacked low first with the symmetric zero point 8 (128 for 8-bit codes), as the quantize
stage packs them. The twin is rewritten on the quantized graph's protobuf, not built with webbuild.graph.builder:
an onnx-ir round trip writes a value_info for each initializer, and the shipped twins' bytes would change.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper

from webbuild.errors import BuildError
from webbuild.forms.form import Form, Made, Miss
from webbuild.graph.load import load_onnx
from webbuild.graph.packing import INT8_ZERO, int8_codes

_C = "wasm_twin/"  # shared constants
FORMS = ("float", "int8", "matmul_nbits")


def twin_name(name: str) -> str:
    """decoder.fp32.onnx -> decoder.fp32.wasm.onnx"""
    return name.removesuffix(".onnx") + ".wasm.onnx"


def int8_plan_name(twin: str) -> str:
    """decoder.fp32.wasm.onnx -> decoder.fp32.wasm.int8.json: the `int8` twin's derivation plan."""
    return twin.removesuffix(".onnx") + ".int8.json"


@dataclass
class Int8Plan:
    """How the uint8 weights an `int8` twin names are derived from the shipped int4 ones: `file`, the name
    the twin's weights point into (made at load, never shipped), `bytes` long; `source`, the weights file
    the int4 codes and scales are read from; per weight its int4 `codes` and float32 `scales` as
    [offset, length] in `source`, its `k` x `n`, `block` size, and where its [K, N] uint8 goes (`at`); `keep`,
    the [offset, length] ranges of `source` the twin itself still reads (its other weights): on wasm the page
    keeps only those of the file once the uint8 weights are derived (runtime/asr.js)."""

    file: str
    source: str
    bytes: int = 0
    tensors: list[dict] = field(default_factory=list)
    keep: list[list[int]] = field(default_factory=list)


def wasm_graph(src: Path, dest: Path, form: str = "float") -> bool:
    """Write `dest`: `src` with GatherBlockQuantized lookups spelt in standard ops and its MatMulNBits in
    `form` (FORMS); an `int8` twin also gets its plan beside it (int8_plan_name). False (nothing written)
    when nothing changes."""
    model = load_onnx(src)
    nodes = list(model.graph.node)
    lookups = [n for n in nodes if n.op_type == "GatherBlockQuantized"]
    matmuls = [n for n in nodes if n.op_type == "MatMulNBits"] if form != "matmul_nbits" else []
    inits = {t.name: t for t in model.graph.initializer}
    plan = Int8Plan(dest.name.removesuffix(".onnx") + ".int8.bin", "")
    if form == "int8":
        matmuls = [n for n in matmuls if int8_ready(n, inits)]
    if not lookups and not matmuls:
        return False
    extra: list[onnx.TensorProto] = []
    for node in lookups + matmuls:
        at = nodes.index(node)
        scales_type = inits[node.input[2]].data_type if node.input[2] in inits else onnx.TensorProto.FLOAT
        if node.op_type == "GatherBlockQuantized":
            new, consts = _lookup_nodes(src, node, scales_type)
        elif form == "int8":
            new, consts = _int8_nodes(src, node, inits, plan)
        else:
            new, consts = _matmul_nodes(src, node, scales_type)
        nodes[at:at + 1] = new
        extra += consts
    model.graph.ClearField("node")
    model.graph.node.extend(nodes)
    shared = [("sixteen", 16, np.int32), ("eight", 8, np.int32), ("last", [-1], np.int64), ("zero", [0], np.int64)]
    if any(_attrs(n).get("bits", 4) == 8 for n in lookups):
        shared.append(("one_two_eight", 128, np.int32))  # 8-bit codes' zero point
    if plan.tensors:
        shared.append(("int8_zero", INT8_ZERO, np.uint8))
    model.graph.initializer.extend([onnx.numpy_helper.from_array(np.array(v, dtype), _C + name)
                                    for name, v, dtype in shared] + extra)
    _drop_unread(model)
    onnx.save(model, str(dest))
    if plan.tensors:
        plan.keep = _ranges_read(model, plan.source)
        (dest.parent / int8_plan_name(dest.name)).write_text(json.dumps(asdict(plan)))
    return True


def twin(src: Path, dest: Path, form: str) -> Made | Miss | None:
    """The wasm twin of `src` in its plan's `form` as a graph form (WASM_TWIN). None where nothing needs spelling
    (no lookup, and no MatMulNBits the form rewrites: `matmul_nbits`, or a graph without any). Where `form` is
    `int8`, a MatMulNBits it cannot take stays (the wasm plan counted it as slow): reported, not lost; where it
    takes none of them, the plan's form is lost."""
    graph = load_onnx(src).graph
    matmuls = sum(n.op_type == "MatMulNBits" for n in graph.node) if form != "matmul_nbits" else 0
    inits = {t.name: t for t in graph.initializer}
    ready = sum(n.op_type == "MatMulNBits" and int8_ready(n, inits) for n in graph.node) if form == "int8" \
        else matmuls
    if not wasm_graph(src, dest, form):
        return Miss(f"the wasm plan's {form} form takes none of its {matmuls} MatMulNBits (codes and float32 "
                    "scales in one weights file)") if matmuls else None
    left = (Miss(f"{matmuls - ready} of {matmuls} MatMulNBits stay MatMulNBits (the int8 form takes only 4-bit "
                 "symmetric ones with codes and float32 scales in one weights file)", loses=ready == 0),)
    return Made(dest.name, left if ready < matmuls else ())


WASM_TWIN = Form("wasm_twin", "a quantized graph the wasm EP runs: its int4 lookups in standard ops, its "
                 "MatMulNBits in the wasm plan's form", twin)


def _drop_unread(model: onnx.ModelProto) -> None:
    """Removes the initializers no node reads (the int4 codes and scales the twin's rewrites replaced; subgraphs'
    reads count), so that the twin names only the weights it uses."""
    read = {i for n in _all_nodes(model.graph) for i in n.input} | {o.name for o in model.graph.output}
    kept = [t for t in model.graph.initializer if t.name in read]
    if len(kept) < len(model.graph.initializer):
        model.graph.ClearField("initializer")
        model.graph.initializer.extend(kept)


def _all_nodes(graph: onnx.GraphProto):
    for n in graph.node:
        yield n
        for a in n.attribute:
            for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs:
                yield from _all_nodes(g)


def _ranges_read(model: onnx.ModelProto, file: str) -> list[list[int]]:
    """[offset, length] of every initializer `model` reads from weights file `file`, in file order, adjacent ones
    joined."""
    spans = sorted(p[1:] for t in model.graph.initializer if (p := _external(t)) and p[0] == file)
    joined: list[list[int]] = []
    for off, length in spans:
        if joined and off <= joined[-1][0] + joined[-1][1]:
            joined[-1][1] = max(joined[-1][1], off + length - joined[-1][0])
        else:
            joined.append([off, length])
    return joined


def foldable(model: onnx.ModelProto) -> bool:
    """Whether every MatMulNBits of `model` is a kind the twin can spell in standard ops (4-bit, symmetric,
    no g_idx or bias): else only the form that keeps them runs on wasm."""
    return all(_matmul_foldable(n) for n in model.graph.node if n.op_type == "MatMulNBits")


def _matmul_foldable(mm: onnx.NodeProto) -> bool:
    return _attrs(mm).get("bits", 4) == 4 and not any(mm.input[3:])


def _external(t: onnx.TensorProto) -> tuple[str, int, int] | None:
    """(file, offset, length) of an initializer stored in a weights file, else None."""
    if t.data_location != onnx.TensorProto.EXTERNAL:
        return None
    e = {x.key: x.value for x in t.external_data}
    return e["location"], int(e.get("offset", 0)), int(e["length"])


def int8_ready(mm: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> bool:
    """Whether the `int8` form takes this MatMulNBits: 4-bit symmetric, codes and float32 scales in one
    weights file (small graphs that keep their weights inside stay MatMulNBits)."""
    codes, scales = (inits.get(name) for name in mm.input[1:3])
    if not _matmul_foldable(mm) or codes is None or scales is None or scales.data_type != onnx.TensorProto.FLOAT:
        return False
    places = [_external(codes), _external(scales)]
    return None not in places and places[0][0] == places[1][0]  # type: ignore[index]


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _nibbles(p: str, packed: str) -> list[onnx.NodeProto]:
    """uint8 `packed` [..., n] -> int32 `p`pairs [..., n, 2]: (low, high) nibbles."""
    n = onnx.helper.make_node
    return [
        n("Cast", [packed], [p + "bytes"], to=onnx.TensorProto.INT32),
        n("Div", [p + "bytes", _C + "sixteen"], [p + "high"]),
        n("Mul", [p + "high", _C + "sixteen"], [p + "high16"]),
        n("Sub", [p + "bytes", p + "high16"], [p + "low"]),
        n("Unsqueeze", [p + "low", _C + "last"], [p + "low1"]),
        n("Unsqueeze", [p + "high", _C + "last"], [p + "high1"]),
        n("Concat", [p + "low1", p + "high1"], [p + "pairs"], axis=-1),
    ]


def _lookup_nodes(src: Path, gbq: onnx.NodeProto, scales_type: int) -> tuple[list[onnx.NodeProto], list]:
    a = _attrs(gbq)
    bits = a.get("bits", 4)
    if bits not in (4, 8) or a.get("gather_axis", 0) != 0 or len(gbq.input) > 3:
        raise BuildError(f"{src}: {gbq.name}: only 4- or 8-bit symmetric row lookups can be rewritten for wasm")
    data, ids, scales = gbq.input[:3]
    p = f"{_C}{gbq.name}/"
    n = onnx.helper.make_node
    return [
        n("Gather", [data, ids], [p + "packed"], axis=0),           # [B, S, blocks, block * bits / 8] uint8
        *(_unpacked_rows(p) if bits == 4 else [n("Cast", [p + "packed"], [p + "codes"], to=onnx.TensorProto.INT32)]),
        n("Sub", [p + "codes", _C + ("eight" if bits == 4 else "one_two_eight")], [p + "centred"]),
        n("Gather", [scales, ids], [p + "scales"], axis=0),                      # [B, S, blocks, 1]
        n("Cast", [p + "centred"], [p + "values"], to=scales_type),
        n("Mul", [p + "values", p + "scales"], [gbq.output[0]]),
    ], []


def _unpacked_rows(p: str) -> list[onnx.NodeProto]:
    """Gathered 4-bit rows `p`packed [B, S, blocks, block/2] -> int32 `p`codes [B, S, blocks, block]."""
    n = onnx.helper.make_node
    return [
        *_nibbles(p, p + "packed"),
        n("Shape", [p + "packed"], [p + "shape"]),
        n("Slice", [p + "shape", _C + "zero", _C + "last"], [p + "lead"]),
        n("Concat", [p + "lead", _C + "last"], [p + "unpacked_shape"], axis=0),
        n("Reshape", [p + "pairs", p + "unpacked_shape"], [p + "codes"]),
    ]


def _matmul_nodes(src: Path, mm: onnx.NodeProto, scales_type: int) -> tuple[list[onnx.NodeProto], list]:
    """MatMulNBits(A, B, scales) -> MatMul(A, W) with W [K, N] dequantized from B [N, blocks, bs/2]."""
    a = _attrs(mm)
    k, width, bs = a["K"], a["N"], a["block_size"]
    if not _matmul_foldable(mm):
        raise BuildError(f"{src}: {mm.name}: only 4-bit symmetric MatMulNBits without zero points, g_idx "
                            "or bias can be rewritten for wasm")
    blocks = -(-k // bs)
    p = f"{_C}{mm.name}/"
    shapes = [onnx.numpy_helper.from_array(np.array(v, np.int64), p + name) for name, v in (
        ("codes_shape", [width, blocks, bs]), ("scales_shape", [width, blocks, 1]),
        ("rows_shape", [width, blocks * bs]), ("k", [k]))]
    n = onnx.helper.make_node
    return [
        *_nibbles(p, mm.input[1]),
        n("Reshape", [p + "pairs", p + "codes_shape"], [p + "codes"]),
        n("Sub", [p + "codes", _C + "eight"], [p + "centred"]),
        n("Reshape", [mm.input[2], p + "scales_shape"], [p + "scales"]),
        n("Cast", [p + "centred"], [p + "values"], to=scales_type),  # Cast, not CastLike: CPU folds only kernels
        n("Mul", [p + "values", p + "scales"], [p + "blocks"]),
        n("Reshape", [p + "blocks", p + "rows_shape"], [p + "rows"]),             # [N, blocks * bs]
        n("Slice", [p + "rows", _C + "zero", p + "k", _C + "last"], [p + "rows_k"]),  # padding past K off
        n("Transpose", [p + "rows_k"], [p + "weight"], perm=[1, 0]),               # [K, N]
        n("MatMul", [mm.input[0], p + "weight"], [mm.output[0]]),
    ], shapes


def _int8_nodes(src: Path, mm: onnx.NodeProto, inits: dict[str, onnx.TensorProto],
                plan: Int8Plan) -> tuple[list[onnx.NodeProto], list]:
    """MatMulNBits(A, B, scales) -> DynamicQuantizeMatMul(A, W, column scales, 128), W [K, N] uint8 in the
    plan's derived file; the column scales (N floats) are computed here and kept inside the graph."""
    a = _attrs(mm)
    k, n, bs = a["K"], a["N"], a["block_size"]
    (location, c_off, c_len), (_, s_off, s_len) = (_external(inits[x]) for x in mm.input[1:3])  # type: ignore[misc]
    if plan.source and plan.source != location:
        raise BuildError(f"{src}: {mm.name}: weights in {location} and {plan.source}; the int8 form reads one file")
    plan.source = location
    weights = np.memmap(src.parent / location, np.uint8, mode="r")
    _, col = int8_codes(weights[c_off:c_off + c_len], np.frombuffer(weights[s_off:s_off + s_len].tobytes(), "<f4"),
                        k, n, bs)
    plan.tensors.append({"codes": [c_off, c_len], "scales": [s_off, s_len], "k": k, "n": n, "block": bs,
                         "at": plan.bytes})
    p = f"{_C}{mm.name}/"
    weight = onnx.TensorProto(name=p + "weight_u8", data_type=onnx.TensorProto.UINT8, dims=[k, n],
                              data_location=onnx.TensorProto.EXTERNAL)
    for key, value in (("location", plan.file), ("offset", str(plan.bytes)), ("length", str(k * n))):
        weight.external_data.add(key=key, value=value)
    plan.bytes += -(-k * n // 64) * 64  # each weight 64-byte aligned
    node = onnx.helper.make_node("DynamicQuantizeMatMul", [mm.input[0], weight.name, p + "column_scales",
                                 _C + "int8_zero"], [mm.output[0]], name=mm.name, domain="com.microsoft")
    return [node], [weight, onnx.numpy_helper.from_array(col, p + "column_scales")]

"""The delta graph: what the page runs at an adapter switch to make the adapted step form's merged updates.

The step form reads each DELTA_GROUPS member's update as one 4-bit MatMulNBits of `lora.{i}.{proj}.delta_codes`
and `.delta_scales` (webbuild.forms.lora.merged_deltas): down @ up in MatMulNBits' symmetric 4-bit blocks of
32 along `in`, as webbuild.site.adapter_pack.quantize_blocks makes them. For the 0.6b that product is 11 G
multiply-adds an adapter, too many for JavaScript at a switch, so the build ships this graph and the page runs it
on the GPU once per layer (runtime/lora-delta.js), reading the adapted graph's down and ups (already on the
GPU) and writing straight into the step's input buffers (onnxruntime-web's pre-allocated GPU outputs).

Its names are the layer's lora names without the `lora.{i}.` prefix: inputs `{group}.down` [in, rank] and
`{proj}.up` [rank, out] in the variant's float type, outputs `{proj}.delta_codes` uint8 [out, in / 32, 16] and
`{proj}.delta_scales` [out, in / 32]. Every dimension is symbolic, so one graph serves every layer; `in` is a
multiple of 32 (merged_deltas merges no other). The product and the quantization run in float32 whatever the
variant (a float16 graph's scales are cast at the end, as adapter_pack's are), so the codes equal quantize_blocks'
of the same values up to the order of the product's sums. Only standard ops that onnxruntime-web's WebGPU EP runs
(a node it lacks would run on the CPU: a read-back and an upload at every switch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto

from webbuild.adapters import DOWN_GROUPS, shared_rank
from webbuild.forms.form import Form, Made, Miss
from webbuild.graph.builder import Builder, new_model, value
from webbuild.graph.files import write_model
from webbuild.site.adapter_pack import BLOCK
from webbuild.site.contract import DELTA_BITS, DELTA_CODES, DELTA_GROUPS, DELTA_SCALES, IO

OPSET = 18  # ReduceMax's axes as an input


def delta_name(group_or_proj: str, factor: str) -> str:
    """The delta graph's name of a layer's lora input: `{group_or_proj}.{factor}`."""
    return f"{group_or_proj}.{factor}"


def layer_prefix(layer: int) -> str:
    """What a layer's lora names (IO.lora) have before the delta graph's: `lora.{i}.`."""
    full, short = IO.lora_input(layer, "x", "y"), delta_name("x", "y")
    assert full.endswith(short), f"IO.lora {IO.lora!r} does not end in the projection and the factor"
    return full.removesuffix(short)


def delta_graph(dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """The delta graph of every DELTA_GROUPS group, for a variant of float type `dtype` (an onnx TensorProto type),
    checked by onnx's full check."""
    return ir.serde.serialize_model(checked(delta_model(ir.DataType(dtype))))


def checked(model: ir.Model) -> ir.Model:
    """`model` once onnx's full check (types and shapes inferred) passes it."""
    onnx.checker.check_model(ir.serde.serialize_model(model), full_check=True)
    return model


def delta_model(dtype: ir.DataType = ir.DataType.FLOAT) -> ir.Model:
    """The delta graph (see delta_graph) as an onnx-ir model."""
    model = new_model("lora_delta", OPSET, ir_version=9, producer="webbuild")
    b = Builder(model.graph, typed_consts=False)
    top = 2 ** (DELTA_BITS - 1) - 1
    consts = {"top": np.float32(top), "zero": np.float32(0), "one": np.float32(1), "low": np.float32(-top),
              "point": np.float32(top + 1), "nibble": np.float32(16), "blocks": np.array([0, -1, BLOCK], np.int64),
              "pairs": np.array([0, -1, BLOCK // 2, 2], np.int64), "last": np.array([2], np.int64),
              "pair": np.array([3], np.int64), "halves": np.array([1, 1], np.int64),
              "magic": np.float32(1.5 * 2 ** 23)}
    c = {k: b.const(f"c/{k}", np.asarray(v)) for k, v in consts.items()}
    for group in DELTA_GROUPS:
        down = b.input(delta_name(group, "down"), dtype, ["in", "rank"])
        down32 = b.op("Cast", [down], name="", output=f"{group}/down32", to=ir.DataType.FLOAT)
        for proj in DOWN_GROUPS[group]:
            up = b.input(delta_name(proj, "up"), dtype, ["rank", f"{proj}_out"])
            model.graph.outputs.extend(_quantized_product(b, c, down32, up, proj, dtype))
    b.place()
    return model


def _quantized_product(b: Builder, c: dict[str, ir.Value], down: ir.Value, up: ir.Value, proj: str,
                       dtype: ir.DataType) -> list[ir.Value]:
    """down @ up as quantize_blocks(., DELTA_BITS): scale = a block's largest magnitude / 7, code = value / scale
    rounded half to even, clipped to +-7, + 8, two codes a byte, the lower nibble first. Returns the codes
    [out, blocks, 16] and the scales [out, blocks], named as the step's inputs less the layer's prefix."""
    def op(op: str, inputs: list[ir.Value], out: str, **attrs: Any) -> ir.Value:
        return b.op(op, inputs, name=f"{proj}/{out}", output=f"{proj}/{out}", **attrs)
    f32 = ir.DataType.FLOAT
    columns = op("Transpose", [op("MatMul", [down, op("Cast", [up], "up32", to=f32)], "product")], "columns",
                 perm=[1, 0])  # [out, in]: MatMulNBits' weight order
    blocked = op("Reshape", [columns, c["blocks"]], "blocked")
    scales = op("Div", [op("ReduceMax", [op("Abs", [blocked], "magnitude"), c["last"]], "largest", keepdims=0),
                        c["top"]], "scales")
    divisor = op("Where", [op("Greater", [scales, c["zero"]], "nonzero"), scales, c["one"]], "divisor")  # zeros: 0
    ratio = op("Div", [blocked, op("Unsqueeze", [divisor, c["last"]], "divisor3")], "ratio")
    # rounded half to even by float32 arithmetic: onnxruntime-web's WebGPU EP has no Round (it would run on the
    # CPU, a read-back and an upload a run); |ratio| <= 7, where adding 1.5 * 2^23 leaves whole numbers
    rounded = op("Sub", [op("Add", [ratio, c["magic"]], "shifted"), c["magic"]], "rounded")
    codes = op("Add", [op("Clip", [rounded, c["low"], c["top"]], "clipped"), c["point"]], "codes")
    halves = [value(f"{proj}/{half}") for half in ("lower", "upper")]
    lower, upper = b.node("Split", [op("Reshape", [codes, c["pairs"]], "paired"), c["halves"]], halves[0].name,
                          halves, axis=3).outputs
    paired = op("Add", [lower, op("Mul", [upper, c["nibble"]], "upper16")], "bytes")
    packed = op("Squeeze", [paired, c["pair"]], "bytes3")
    shape = [f"{proj}_out", "blocks"]
    return [b.named("Cast", [packed], delta_name(proj, DELTA_CODES), ir.DataType.UINT8,
                    [*shape, BLOCK * DELTA_BITS // 8], to=ir.DataType.UINT8).outputs[0],
            b.named("Cast", [scales], delta_name(proj, DELTA_SCALES), dtype, shape, to=dtype).outputs[0]]


def write_delta_graph(step: Path, dest: Path) -> Made | Miss:
    """The delta graph for the adapted step graph `step`, written to `dest`; a Miss (nothing written, nothing lost:
    the step form has no merged update to make) where the step reads none."""
    graph = ir.load(step).graph  # the weights stay in their file: only the inputs are read
    scales = [v.dtype for v in graph.inputs if (parts := IO.lora_parts(v.name or "")) and parts[2] == DELTA_SCALES]
    if not scales or scales[0] is None:
        return Miss("the adapted step form reads no merged update", loses=False)
    write_model(checked(delta_model(scales[0])), dest)
    return Made(dest.name)


DELTA = Form("lora_delta", "an adapted step form reading merged updates: the graph the page runs at an adapter "
             "switch to make them", write_delta_graph)


def differences(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> list[str]:
    """What keeps merged updates `got` from being `want` (adapter_pack.delta_inputs' form), one line per input; none
    where every input has its shape and type, scales agree to 1e-5 and codes do: a product's sums in another order
    than numpy's can move a value across a rounding boundary, so a code may be one step off, rarely (< 0.1%)."""
    problems = []
    for name, w in want.items():
        g = got.get(name)
        if g is None or g.shape != w.shape or g.dtype != w.dtype:
            problems.append(f"{name}: {None if g is None else (g.dtype, g.shape)}, expected {(w.dtype, w.shape)}")
        elif name.endswith(DELTA_SCALES):
            if not np.allclose(g.astype(np.float32), w.astype(np.float32), rtol=1e-5, atol=0):
                problems.append(f"{name}: scales differ")
        else:
            steps = np.maximum(*(np.abs((g.astype(np.int16) >> s & 15) - (w.astype(np.int16) >> s & 15))
                                 for s in (0, 4)))
            if steps.max() > 1 or (steps > 0).mean() >= 1e-3:
                problems.append(f"{name}: codes up to {steps.max()} steps off in {(steps > 0).mean():.2%}")
    return problems


def random_layer(n_in: int, n_out: dict[str, int], rank: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Layer 0's down and ups of a random adapter of `rank` (graph_inputs' form: each up in its own rows of the
    group's shared rank) for the DELTA_GROUPS projections of widths `n_out`."""
    rng, out = np.random.default_rng(seed), {}
    for group in DELTA_GROUPS:
        projs, shared = DOWN_GROUPS[group], shared_rank(group, rank)
        out[IO.lora_input(0, group, "down")] = rng.normal(0, 0.05, (n_in, shared)).astype(np.float32)
        for i, proj in enumerate(projs):
            up = out[IO.lora_input(0, proj, "up")] = np.zeros((shared, n_out[proj]), np.float32)
            up[i * rank:(i + 1) * rank] = rng.normal(0, 0.5, (rank, n_out[proj]))
    return out


def run_layer(delta: onnx.ModelProto | Path, inputs: dict[str, np.ndarray], layer: int = 0) -> dict[str, np.ndarray]:
    """The delta graph on onnxruntime CPU for one layer of `inputs` (lora names; cast to the graph's float type),
    its outputs named as the step's inputs."""
    from webbuild.graph import cpu_session as cpu  # onnxruntime: imported only where a delta graph runs

    model = delta if isinstance(delta, onnx.ModelProto) else onnx.load(str(delta))
    session = cpu.session(model.SerializeToString())
    prefix = layer_prefix(layer)
    dtype = np.float16 if model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16 else np.float32
    feeds = {i.name: inputs[prefix + i.name].astype(dtype) for i in session.get_inputs()}
    return {prefix + o.name: v for o, v in zip(session.get_outputs(), session.run(None, feeds))}

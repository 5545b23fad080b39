"""Each adapter pass of webbuild.forms.lora on a small hand-built decoder layer, by what it computes: the
adapted graph fed a non-zero random adapter (its step inputs made by adapter_pack.step_inputs from the layout the
passes record, lora.step_layout) gives numpy's layer with every projection's weights W + down @ up, where W are
the 4-bit weights the graph holds and down and up are the adapter's as the pass reads them (float, or in the blocks
it quantizes them to). Run on onnxruntime CPU.

The layer: a norm, q, k and v (4-bit MatMulNBits of external weights), GroupQueryAttention of one token over a
past of two, o, the skip norm, gate and up, SiLU(gate) x up, down and the residual, as the decoder's layers are.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from webbuild.adapters import DOWN_GROUPS, RANK
from webbuild.forms.form import Report, strict_failures
from webbuild.forms.lora import (
    ADAPTED,
    adapted_step,
    drop_unread_inputs,
    joint_downs,
    lora_form,
    merged_deltas,
    mlp_updates_as_biases,
    packed_updates,
    quantized_downs,
    spare_readers,
    step_layout,
)
from webbuild.forms.step import STEP
from webbuild.graph.ir import dead_code_elimination
from webbuild.site.adapter_pack import down_bits, quantize_blocks, step_inputs, update
from webbuild.site.contract import IO

H, HEADS, HEAD, INTER, PAST = 64, 2, 32, 128, 2  # hidden, query heads (one key/value head), head size, MLP, past
WIDTHS = {"q_proj": (H, HEADS * HEAD), "k_proj": (H, HEAD), "v_proj": (H, HEAD), "o_proj": (H, H),
          "gate_proj": (H, INTER), "up_proj": (H, INTER), "down_proj": (INTER, H)}
EPS = 1e-6
VOCAB = 40  # the decoder's (as_decoder)
MS = "com.microsoft"


def dequantize(codes: np.ndarray, scales: np.ndarray, bits: int, k: int) -> np.ndarray:
    """MatMulNBits' symmetric codes [N, blocks, ...] and scales [N, blocks] as the float [k, N] they stand for."""
    if bits == 4:
        codes = np.stack([codes & 15, codes >> 4], axis=-1).reshape(*codes.shape[:2], -1)
    values = (codes.astype(np.float32) - 2 ** (bits - 1)) * scales.reshape(codes.shape[:2])[..., None]
    return np.ascontiguousarray(values.reshape(codes.shape[0], -1)[:, :k].T)


def in_blocks(w: np.ndarray, bits: int, block: int = 32) -> np.ndarray:
    """`w` [K, N] as `bits`-bit MatMulNBits blocks give it back."""
    return dequantize(*quantize_blocks(w, bits, block), bits, w.shape[0])


class Layer:
    """The hand-built layer: its 4-bit weights (as floats too), norms, a token and a past, saved as `model.onnx`
    with its weights as external data in `model.onnx.data` (joint_downs joins only such projections)."""

    def __init__(self, folder: Path, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.folder = folder
        self.quantized = {p: quantize_blocks(rng.normal(0, 0.2, dims).astype(np.float32), 4)
                          for p, dims in WIDTHS.items()}
        self.weights = {p: dequantize(*self.quantized[p], 4, WIDTHS[p][0]) for p in WIDTHS}
        self.norms = [rng.uniform(0.5, 1.5, H).astype(np.float32) for _ in range(2)]
        self.feeds = {"x": rng.normal(0, 1, (1, 1, H)).astype(np.float32),
                      "past_key": rng.normal(0, 1, (1, 1, PAST, HEAD)).astype(np.float32),
                      "past_value": rng.normal(0, 1, (1, 1, PAST, HEAD)).astype(np.float32),
                      "seqlens_k": np.array([PAST], np.int32), "total_sequence_length": np.array(PAST + 1, np.int32)}
        onnx.save(self.graph(), str(folder / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                  location="model.onnx.data", size_threshold=0)

    def graph(self) -> onnx.ModelProto:
        inits = [numpy_helper.from_array(w, f"norm{i}") for i, w in enumerate(self.norms)]
        for proj in WIDTHS:
            inits += [numpy_helper.from_array(part, f"{proj}.{name}")
                      for part, name in zip(self.quantized[proj], ("codes", "scales"))]
        f = TensorProto.FLOAT
        info = lambda name, dims, t=f: helper.make_tensor_value_info(name, t, dims)  # noqa: E731
        inputs = [info("x", [1, 1, H]), info("past_key", [1, 1, PAST, HEAD]), info("past_value", [1, 1, PAST, HEAD]),
                  info("seqlens_k", [1], TensorProto.INT32), info("total_sequence_length", [], TensorProto.INT32)]
        shapes = {"n1": H, "attn": H, "n2": H, "sum": H, "prod": INTER} | {p: n for p, (_, n) in WIDTHS.items()}
        graph = helper.make_graph(layer_nodes(), "layer", inputs, [info("y", [1, 1, H])], inits,
                                  value_info=[info(v, [1, 1, n]) for v, n in shapes.items()])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])

    def reference(self, updates: dict[str, np.ndarray]) -> np.ndarray:
        """numpy's layer with each projection's weights W + updates[proj] ([in, out]; absent: W)."""
        w = {p: self.weights[p] + updates.get(p, 0) for p in WIDTHS}
        x = self.feeds["x"][0]
        n1 = rms(x, self.norms[0])
        q, k, v = (n1 @ w[p] for p in ("q_proj", "k_proj", "v_proj"))
        keys = np.concatenate([self.feeds["past_key"][0, 0], k])
        values = np.concatenate([self.feeds["past_value"][0, 0], v])
        heads = []
        for h in range(HEADS):
            scores = q[:, h * HEAD:(h + 1) * HEAD] @ keys.T / np.sqrt(HEAD)
            weights = np.exp(scores - scores.max())
            heads.append(weights / weights.sum() @ values)
        residual = np.concatenate(heads, axis=-1) @ w["o_proj"] + x
        n2 = rms(residual, self.norms[1])
        gate, up = n2 @ w["gate_proj"], n2 @ w["up_proj"]
        return (gate / (1 + np.exp(-gate)) * up @ w["down_proj"] + residual)[None]

    def run(self, model: ir.Model, adapter: dict[str, np.ndarray]) -> np.ndarray:
        """`model`'s y with the adapter's step inputs fed (its float inputs as they are)."""
        path = self.folder / "adapted.onnx"
        ir.save(model, path)
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        weights = lambda name: np.fromfile(self.folder / name, np.uint8)  # noqa: E731
        feeds = adapter | step_inputs(adapter, step_layout(model), weights)
        names = {i.name for i in sess.get_inputs()}
        return sess.run(["y"], {n: v for n, v in (self.feeds | feeds).items() if n in names})[0]


def layer_nodes() -> list[onnx.NodeProto]:
    """The layer's nodes, named as its values: x -> norm -> q, k, v -> attention -> o -> skip norm -> gate, up ->
    SiLU(gate) x up -> down + the residual sum -> y."""
    def nbits(proj: str, x: str) -> onnx.NodeProto:
        k, n = WIDTHS[proj]
        return helper.make_node("MatMulNBits", [x, f"{proj}.codes", f"{proj}.scales"], [proj], name=proj, domain=MS,
                                K=k, N=n, bits=4, block_size=32, accuracy_level=0)
    gqa = ["q_proj", "k_proj", "v_proj", "past_key", "past_value", "seqlens_k", "total_sequence_length"]
    return [helper.make_node("SimplifiedLayerNormalization", ["x", "norm0"], ["n1"], axis=-1, epsilon=EPS),
            *(nbits(p, "n1") for p in ("q_proj", "k_proj", "v_proj")),
            helper.make_node("GroupQueryAttention", gqa, ["attn", "present_key", "present_value"], domain=MS,
                             num_heads=HEADS, kv_num_heads=1),
            nbits("o_proj", "attn"),
            helper.make_node("SkipSimplifiedLayerNormalization", ["o_proj", "x", "norm1"], ["n2", "", "", "sum"],
                             domain=MS, epsilon=EPS),
            nbits("gate_proj", "n2"), nbits("up_proj", "n2"),
            helper.make_node("Sigmoid", ["gate_proj"], ["sig"]),
            helper.make_node("Mul", ["gate_proj", "sig"], ["silu"]),
            helper.make_node("Mul", ["silu", "up_proj"], ["prod"]), nbits("down_proj", "prod"),
            helper.make_node("Add", ["down_proj", "sum"], ["y"])]


def rms(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * w


def random_adapter(seed: int = 1) -> dict[str, np.ndarray]:
    """A non-zero rank-RANK adapter of the layer in adapter_pack.graph_inputs' form: each group's down, each
    projection's up in its own rows of the group's rank."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for group, projs in DOWN_GROUPS.items():
        k = WIDTHS[projs[0]][0]
        inputs[IO.lora_input(0, group, "down")] = rng.normal(0, 0.3, (k, RANK * len(projs))).astype(np.float32)
        for i, proj in enumerate(projs):
            up = np.zeros((RANK * len(projs), WIDTHS[proj][1]), np.float32)
            up[i * RANK:(i + 1) * RANK] = rng.normal(0, 0.3, (RANK, WIDTHS[proj][1]))
            inputs[IO.lora_input(0, proj, "up")] = up
    return inputs


def as_read(adapter: dict[str, np.ndarray], proj: str, down: Callable | None = None,
            up: Callable | None = None, merged: Callable | None = None) -> np.ndarray:
    """The update down @ up of `proj` as a pass reads it: its down, its up or their product through the block
    quantization given (None: float)."""
    group = next(g for g, projs in DOWN_GROUPS.items() if proj in projs)
    d, u = adapter[IO.lora_input(0, group, "down")], adapter[IO.lora_input(0, proj, "up")]
    if merged:
        return merged(d @ u)
    return (down(d) if down else d) @ (up(u) if up else u)


@pytest.fixture
def layer(tmp_path) -> Layer:
    return Layer(tmp_path)


def adapted(layer: Layer, *passes: Callable[[ir.Model], object]) -> ir.Model:
    """The layer through lora_form, then `passes` in order (a step pass: on the graph or on the model)."""
    model = ir.load(layer.folder / "model.onnx")
    lora_form(model)
    for rewrite in passes:
        rewrite(model)
    return model


def graph_pass(rewrite: Callable[[ir.Graph], object]) -> Callable[[ir.Model], object]:
    return lambda model: rewrite(model.graph)


def tidy(model: ir.Model) -> None:
    """What step_form does after the packing passes: the nodes and inputs left unread go."""
    dead_code_elimination(model)
    drop_unread_inputs(model.graph)


def check(layer: Layer, model: ir.Model, adapter: dict, updates: dict[str, np.ndarray], atol: float = 1e-4) -> None:
    """The adapted model gives the reference with `updates`, which an adapter-free run is far from."""
    got, want, base = layer.run(model, adapter), layer.reference(updates), layer.reference({})
    assert np.abs(want - base).max() > 100 * atol, "the adapter changes the output"
    np.testing.assert_allclose(got, want, atol=atol, rtol=1e-4)


def test_lora_form_adds_each_projections_update(layer):
    """lora_form: every projection's output plus (x @ down) @ up, the downs shared by their group; fed zeros,
    the base layer exactly."""
    model = adapted(layer)
    adapter = random_adapter()
    check(layer, model, adapter, {p: update(adapter, 0, p) for p in WIDTHS})
    zeros = {n: np.zeros_like(v) for n, v in adapter.items()}
    np.testing.assert_array_equal(layer.run(model, zeros), layer.run(ir.load(layer.folder / "model.onnx"), {}))


def test_mlp_updates_as_biases_keep_the_updates(layer):
    """mlp_updates_as_biases: gate's and up's updates as their MatMulNBits' bias, the same sums."""
    model = adapted(layer, graph_pass(mlp_updates_as_biases))
    assert sum(n.op_type == "MatMulNBits" and len(n.inputs) == 6 for n in model.graph) == 2
    adapter = random_adapter()
    check(layer, model, adapter, {p: update(adapter, 0, p) for p in WIDTHS})


def test_packed_updates_add_q_k_v_updates_with_their_4_bit_down(layer):
    """packed_updates: q, k and v as one MatMulNBits and their down in 4-bit blocks (the packed up float)."""
    model = adapted(layer, graph_pass(packed_updates), tidy)
    assert IO.lora_input(0, "qkv_proj", "up") in {v.name for v in model.graph.inputs}
    adapter = random_adapter(2)
    four = lambda d: in_blocks(d, 4)  # noqa: E731
    updates = {p: as_read(adapter, p, down=four) for p in DOWN_GROUPS["qkv_proj"]}
    check(layer, model, adapter, updates | {p: update(adapter, 0, p) for p in WIDTHS if p not in updates})


def test_joint_downs_add_o_and_downs_updates_through_the_joint_weights(layer):
    """joint_downs: o's and down's projections read their weights from the joint inputs (the base rows copied from
    the weights file by the layout's `base`), their down in the projection's 4-bit blocks, their up 8-bit."""
    model = adapted(layer, joint_downs, tidy)
    assert {r["kind"] for r in step_layout(model).values()} >= {"joint_down", "joint_up"}
    adapter = random_adapter(3)
    updates = {p: as_read(adapter, p, down=lambda d: in_blocks(d, 4), up=lambda u: in_blocks(u, 8))
               for p in ("o_proj", "down_proj")}
    check(layer, model, adapter, updates | {p: update(adapter, 0, p) for p in WIDTHS if p not in updates})


def test_merged_deltas_add_gate_and_ups_updates_merged_in_4_bit_blocks(layer):
    """merged_deltas: gate's and up's updates as one 4-bit MatMulNBits each of down @ up (what the page's delta
    graph makes; here adapter_pack's)."""
    model = adapted(layer, graph_pass(mlp_updates_as_biases), graph_pass(merged_deltas), tidy)
    assert {r["kind"] for r in step_layout(model).values()} == {"delta", "float"}
    adapter = random_adapter(4)
    updates = {p: as_read(adapter, p, merged=lambda w: in_blocks(w, 4)) for p in DOWN_GROUPS["gate_up_proj"]}
    check(layer, model, adapter, updates | {p: update(adapter, 0, p) for p in WIDTHS if p not in updates})


def test_quantized_downs_read_each_down_in_its_blocks(layer):
    """quantized_downs: every down a MatMulNBits of its codes and scales (4-bit for q/k/v's and gate/up's, 8-bit
    for the others), the ups float."""
    model = adapted(layer, graph_pass(quantized_downs))
    assert not any(n.op_type == "MatMul" and (n.name or "").endswith("/low") for n in model.graph)
    adapter = random_adapter(5)
    updates = {p: as_read(adapter, p, down=lambda d, g=g: in_blocks(d, down_bits(g)))
               for g, projs in DOWN_GROUPS.items() for p in projs}
    check(layer, model, adapter, updates)


def test_the_whole_step_chain_with_spares_gives_the_same_layer(layer):
    """The passes in step_form's order, then spare_readers (readers of zero scales that nothing reads): the same
    layer as each pass alone says."""
    model = adapted(layer, graph_pass(mlp_updates_as_biases), graph_pass(packed_updates), joint_downs,
                    graph_pass(merged_deltas), tidy, graph_pass(quantized_downs))
    assert spare_readers(model) > 0
    adapter = random_adapter(6)
    four, eight = (lambda w, b=b: in_blocks(w, b) for b in (4, 8))
    updates = {p: as_read(adapter, p, down=four) for p in DOWN_GROUPS["qkv_proj"]}
    updates |= {p: as_read(adapter, p, down=four, up=eight) for p in ("o_proj", "down_proj")}
    updates |= {p: as_read(adapter, p, merged=four) for p in DOWN_GROUPS["gate_up_proj"]}
    check(layer, model, adapter, updates)


def as_decoder(layer: Layer, path: Path, external: bool) -> None:
    """The layer as a decoder the step form takes: token ids through an embedding, an attention mask (the step
    form's lengths come from it), logits out; its weights saved as external data or inside the graph."""
    rng = np.random.default_rng(7)
    model = layer.graph()
    graph, f = model.graph, TensorProto.FLOAT
    graph.initializer.extend([numpy_helper.from_array(rng.normal(0, 1, (VOCAB, H)).astype(np.float32), "embed"),
                              numpy_helper.from_array(rng.normal(0, 1, (H, VOCAB)).astype(np.float32), "lm_head")])
    graph.node.insert(0, helper.make_node("Gather", ["embed", IO.input_ids], ["x"], name="embed"))
    graph.node.append(helper.make_node("MatMul", ["y", "lm_head"], [IO.logits], name="lm_head"))
    inputs = [i for i in graph.input if i.name != "x"]
    del graph.input[:]
    graph.input.extend([helper.make_tensor_value_info(IO.input_ids, TensorProto.INT64, [1, 1]),
                        helper.make_tensor_value_info(IO.attention_mask, TensorProto.INT64, [1, PAST + 1]), *inputs])
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info(IO.logits, f, [1, 1, VOCAB]))
    onnx.save(model, str(path), save_as_external_data=external, location=f"{path.name}.data", size_threshold=0)


@pytest.mark.parametrize("external", [True, False])
def test_a_step_pass_that_takes_nothing_is_a_lost_part_in_the_forms_report(layer, external):
    """Through the forms driver: the adapted decoder's step form made, and a pass that finds none of the places its
    layout expects (joint_downs joins only projections whose weights are external data) a Miss that names it and
    loses (--strict fails); with the weights external every pass takes every place, and nothing is reported."""
    folder = layer.folder / ("external" if external else "inline")
    folder.mkdir()
    as_decoder(layer, folder / "decoder.onnx", external)
    report = Report()
    adapted_file = report.make(ADAPTED, "fp32/decoder", folder, "decoder.onnx")
    assert adapted_file and report.make(STEP, "fp32/decoder_lora", folder, adapted_file) == "decoder.lora.step.onnx"
    if external:
        assert report.missed == []
        return
    assert report.missed == [{"form": "step", "graph": "fp32/decoder_lora", "loses": True,
                              "why": "joint_downs took 0 of 2: o's and down's downs stay beside their projections "
                                     "(not plain MatMulNBits of external weights)"}]
    assert strict_failures(report.as_dict())[1].startswith("fp32/decoder_lora: step: joint_downs took 0 of 2")


def test_adapted_step_reports_only_what_a_pass_left(layer):
    """adapted_step on the adapted layer: every pass takes all its places (no Miss); a graph whose q, k and v read
    different inputs has nothing packed, a losing Miss, and the other passes still run (quantized_downs takes the
    group's down instead)."""
    model = adapted(layer)
    assert adapted_step(model) == []
    model = adapted(layer)
    k = next(n for n in model.graph if n.name == "k_proj")
    k.replace_input_with(0, model.graph.inputs[0])  # x rather than its norm: three projections packed into one no more
    misses = adapted_step(model)
    assert [(m.reason.split(":")[0], m.loses) for m in misses] == [("packed_updates took 0 of 1", True)]
    assert not any(n.op_type == "MatMul" and (n.name or "").endswith("/low") for n in model.graph)

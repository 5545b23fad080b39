"""LoRA adapters in the build (docs/adapters.md): each packed as its own int8 file listed in the manifest,
an adapted decoder in every form beside the unchanged base, and the Python reference with one on."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from click.testing import CliRunner

from tests.example_config import EXAMPLE
from webbuild.adapters import DOWN_GROUPS, TARGET_MODULES, shared_rank
from webbuild.cli import main
from webbuild.forms.lora import QKV, NoProjections, find_projections
from webbuild.reference.audio import read_wav
from webbuild.reference.transcribe import IdsDecoder, cpu_form, load_transcriber
from webbuild.site.adapter_pack import (
    dequantize_int8,
    down_bits,
    graph_inputs,
    pack,
    quantize_blocks,
    quantize_int8,
    stored_parameters,
    unpack,
    update,
)
from webbuild.site.contract import (
    DELTA_CODES,
    DELTA_GROUPS,
    DELTA_SCALES,
    DOWN_CODES,
    DOWN_SCALES,
    IO,
    JOINT_CODES,
    JOINT_DOWNS,
    JOINT_SCALES,
    PACKED_UPS,
    UP_CODES,
    UP_SCALES,
)
from webbuild.site.manifest import load_manifest, reassemble

KLATT = EXAMPLE / "adapters" / "klatt"
needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed")
SAMPLES = sorted((EXAMPLE / "samples").glob("*.wav"))
ADAPTED = ("decoder_lora", "decoder_lora_step", "decoder_lora_wasm")  # the adapted graphs' roles


@pytest.fixture(scope="module")
def sites(example_dist, example_dist_without_adapters) -> dict[str, Path]:
    """The example built as is (its adapter klatt, at the scale its model.yaml sets) and without any."""
    return {"with": example_dist, "without": example_dist_without_adapters}


@pytest.mark.parametrize("k", [256, 40])
def test_int8_layout_round_trip(k):
    """Blocks of 32 along K (K padded), zero point 128, an error of at most half a step per block."""
    w = np.random.default_rng(0).normal(size=(k, 24)).astype(np.float32)
    codes, scales = quantize_int8(w)
    assert codes.shape == (24, -(-k // 32), 32) and codes.dtype == np.uint8 and scales.shape == (24, -(-k // 32))
    back = dequantize_int8(codes, scales, k)
    step = np.repeat(scales, 32, axis=1)[:, :k].T
    assert np.all(np.abs(back - w) <= step / 2 + 1e-7)
    assert np.all(codes[:, -1, k % 32 or 32:] == 128) if k % 32 else True  # padding quantizes to zero


@pytest.mark.parametrize("k", [256, 40])
def test_int4_layout_round_trip(k):
    """The step form's 4-bit downs (quantize_blocks(w, 4), MatMulNBits' layout): two codes a byte, the lower
    nibble first, zero point 8, scale = the block's largest magnitude / 7, an error of at most half a step."""
    w = np.random.default_rng(1).normal(size=(k, 24)).astype(np.float32)
    codes, scales = quantize_blocks(w, 4)
    blocks = -(-k // 32)
    assert codes.shape == (24, blocks, 16) and codes.dtype == np.uint8 and scales.shape == (24, blocks)
    nibbles = np.stack([codes & 15, codes >> 4], axis=-1).reshape(24, blocks, 32)
    assert nibbles.min() >= 1 and nibbles.max() <= 15  # -7..7 about 8
    back = dequantize_int8(nibbles.astype(np.int64) + 120, scales, k)  # the same arithmetic about 128
    step = np.repeat(scales, 32, axis=1)[:, :k].T
    assert np.all(np.abs(back - w) <= step / 2 + 1e-6)
    assert np.allclose(scales, np.abs(np.pad(w.T, ((0, 0), (0, blocks * 32 - k)))).reshape(24, blocks, 32).max(2) / 7)


@pytest.mark.parametrize("precision, tolerance", [("int8", 0.02), ("fp16", 1e-3), ("fp32", 0.0)])
def test_pack_unpack(precision, tolerance):
    inputs = graph_inputs(KLATT, num_layers=4, scale=1.0)
    data, tensors = pack(inputs, precision)
    assert all(e["offset"] % 4 == 0 and e.get("scales_offset", 0) % 4 == 0 for e in tensors.values())
    back = unpack(data, tensors, precision)
    for name, w in inputs.items():
        assert back[name].shape == w.shape
        assert np.abs(back[name] - w).max() <= tolerance * np.abs(w).max() + 1e-9, name
    # an up's file keeps its own rows of the group's rank: q's the first 32 of 96, v's the last
    assert tensors["lora.1.q_proj.up"]["rows"] == [0, 32] and tensors["lora.1.v_proj.up"]["rows"] == [64, 96]
    assert "rows" not in tensors["lora.1.qkv_proj.down"] and "rows" not in tensors["lora.1.o_proj.up"]


@pytest.mark.parametrize("precision", ["int8", "fp16", "fp32"])
def test_pack_keeps_zero_rows_out(precision):
    """Only the rows outside which an input is zero are stored; an input of zeros stores nothing."""
    band = np.zeros((96, 8), np.float32)
    band[40:50] = np.random.default_rng(0).normal(size=(10, 8))
    inputs = {"band": band, "zeros": np.zeros((64, 8), np.float32)}
    data, tensors = pack(inputs, precision)
    assert tensors["band"]["rows"] == [40, 50] and tensors["zeros"]["rows"] == [0, 0]
    back = unpack(data, tensors, precision)
    assert not back["zeros"].any() and back["zeros"].shape == (64, 8)
    assert not back["band"][:40].any() and not back["band"][50:].any()
    np.testing.assert_allclose(back["band"], band, atol=0.02 * np.abs(band).max())


def test_graph_inputs_are_peft_transposed_and_scaled():
    """A group's down = its projections' A^T side by side; each up = (B * lora_alpha / r * scale)^T in its own
    rows of the group's rank, zeros elsewhere; down @ up is each projection's PEFT update."""
    from webbuild.adapters import read_tensors, tensor_name

    peft = read_tensors(KLATT / "adapter_model.safetensors")
    alpha = json.loads((KLATT / "adapter_config.json").read_text())["lora_alpha"]
    inputs = graph_inputs(KLATT, num_layers=4, scale=0.5)
    a = {p: peft[tensor_name(2, p, "A")] for p in TARGET_MODULES}
    b = {p: peft[tensor_name(2, p, "B")] * alpha / 32 * 0.5 for p in TARGET_MODULES}
    np.testing.assert_array_equal(inputs["lora.2.qkv_proj.down"], np.concatenate([a[p].T for p in QKV], axis=1))
    gate_up = np.concatenate([a["gate_proj"].T, a["up_proj"].T], axis=1)
    np.testing.assert_array_equal(inputs["lora.2.gate_up_proj.down"], gate_up)
    np.testing.assert_array_equal(inputs["lora.2.o_proj.down"], a["o_proj"].T)
    v_up = inputs["lora.2.v_proj.up"]
    assert v_up.shape == (96, b["v_proj"].shape[0]) and not v_up[:64].any()
    np.testing.assert_allclose(v_up[64:], b["v_proj"].T, rtol=1e-6)
    for proj in TARGET_MODULES:
        np.testing.assert_allclose(update(inputs, 2, proj), a[proj].T @ b[proj].T, rtol=1e-5, atol=1e-7)


def test_adapter_ships_as_its_own_file_at_int8_size(sites):
    manifest = load_manifest(sites["with"] / "model")
    entry = manifest["adapters"]["klatt"]
    assert entry["precision"] == "int8" and entry["rank"] == 32 and entry["file"] == "adapter.klatt.bin"
    assert list(entry["tensors"]) == [name for i in range(4) for group, projs in DOWN_GROUPS.items()
                                      for name in [IO.lora_input(i, group, "down")]
                                      + [IO.lora_input(i, p, "up") for p in projs]]
    parameters = stored_parameters(entry["tensors"])
    assert parameters == 622_592  # rank 32 on the 7 projections of 4 layers: the ups' zero rows not stored
    assert manifest["files"]["adapter.klatt.bin"]["size"] == entry["bytes"] <= 1.2 * parameters
    report = json.loads((sites["with"] / "build-report.json").read_text())
    assert report["adapters"]["klatt"]["int8_ratio"] == pytest.approx(1.125)
    for variant in manifest["variants"].values():  # the adapter is not part of any variant's download
        assert "adapter.klatt.bin" not in variant["files"]


def test_base_download_does_not_change(sites):
    """Every file of a build without adapters is in the build with them, byte for byte."""
    base, adapted = (load_manifest(sites[k] / "model") for k in ("without", "with"))
    for variant, entry in base["variants"].items():
        assert {f: base["files"][f]["sha256"] for f in entry["files"]} == \
               {f: adapted["files"][f]["sha256"] for f in entry["files"]}
        roles = adapted["variants"][variant]
        added = set(roles["files"]) - set(entry["files"])
        assert added == {roles[r] for r in (*ADAPTED, "decoder_lora_delta") if r in roles}
        assert ("decoder_lora_delta" in roles) == ("decoder_lora_step" in roles)  # its merged updates' maker
    assert "adapters" not in base


def test_adapted_forms_have_the_raw_pattern(sites, tmp_path):
    """Every projection of the adapted WebGPU, step and wasm graphs: base + MatMul(MatMul(x, down), up) + Add
    on 2-D rows (Reshape to [-1, in] / [-1, out], and back to [1, -1, out]), down and up inputs without
    defaults (onnxruntime-web could not feed an input that has one); one down MatMul for q, k and v, one for
    gate and up. The step form's downs are MatMulNBits (low_of), its gate and up take their merged updates as a
    bias (test_the_step_form_gives_gate_and_up_their_merged_updates_as_biases), q, k and v are one packed projection
    (test_the_step_form_packs_q_k_v) and o and down joined to their downs
    (test_the_step_form_joins_o_and_down_to_their_downs)."""
    for role, model in adapted_graphs(sites["with"], tmp_path).items():
        inputs = {v.name: v for v in model.graph.inputs}
        for layer, (group, projs) in itertools.product(range(4), DOWN_GROUPS.items()):
            step = role == "decoder_lora_step"
            if step and group in (*PACKED_UPS, *JOINT_DOWNS, *DELTA_GROUPS):  # their own tests
                continue
            low = low_of(inputs, layer, group, step, bits=down_bits(group) if step else 8)
            low_rows = low.outputs[0]
            assert len(low_rows.uses()) == len(projs), role
            for proj in projs:
                up = inputs[IO.lora_input(layer, proj, "up")]
                assert up.const_value is None, role
                rank = "lora_rank" if len(projs) == 1 else f"lora_rank_{group}"
                assert up.shape[0] == rank and (step or low.inputs[1].shape[1] == rank), role
                (delta, _), = up.uses()
                assert delta.inputs[0] is low_rows, role
                (add, _), = delta.outputs[0].uses()
                (back, _), = add.outputs[0].uses()
                assert (delta.op_type, add.op_type, back.op_type) == ("MatMul", "Add", "Reshape")
                rows, base = low.inputs[0].producer(), add.inputs[1].producer()
                assert (rows.op_type, base.op_type) == ("Reshape", "Reshape"), role
                assert base.inputs[0].producer().op_type in ("MatMulNBits", "MatMul"), role
                assert len(low.outputs[0].shape) == len(base.outputs[0].shape) == 2, role
                assert list(back.inputs[1].const_value.numpy()) == [1, -1, up.shape[1]], role


def test_the_attention_norm_feeds_q_k_v_alone(sites, tmp_path):
    """onnxruntime-web fuses a norm read by exactly three MatMulNBits into one kernel (MatMulNBitsQkvFusion):
    in the adapted graphs each layer's q, k and v branches read their own copy of the norm
    (lora/{i}/qkv_proj/norm), so the base's norm output keeps its three readers. The WebGPU forms: the wasm twin's
    float MatMuls have no such fusion to keep."""
    for role, model in adapted_graphs(sites["with"], tmp_path).items():
        if role in ("decoder_lora_wasm", "decoder_lora_step"):  # the step form packs q, k and v (the next test)
            continue
        norms = {n.name: n for n in model.graph if n.name.startswith("lora/") and n.name.endswith("/norm")}
        assert len(norms) == 8, role  # q/k/v's and gate/up's
        for layer in range(4):
            q = model.graph.node(f"lora/{layer}/qkv_proj/x2").inputs[0]
            assert q is norms[f"lora/{layer}/qkv_proj/norm"].outputs[0], role
            base_norm = model.graph.node(f"lora/{layer}/q_proj/y2").inputs[0].producer().inputs[0].producer()
            assert base_norm.op_type in ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"), role
            assert sorted(u.op_type for u, _ in base_norm.outputs[0].uses()) == ["MatMulNBits"] * 3, role


def test_the_step_form_packs_q_k_v(sites, tmp_path):
    """The step form's q, k and v (lora.packed_updates): one MatMulNBits whose weights are a Concat of theirs
    (folded by onnxruntime), their down a 4-bit MatMulNBits, and a spare of it (lora.spare_readers) reading
    zero scales, the three the layer's norm's only readers, as onnxruntime-web's fused Q/K/V kernel needs them:
    4-bit, blocks of 32, one accuracy level, no bias, two of one width. Then low @ `lora.{i}.qkv_proj.up` (their
    ups side by side, the members' own ups gone) + the packed output, and a Split into the layer's attention's query,
    key and value. No copy of the norm is left."""
    model = adapted_graphs(sites["with"], tmp_path)["decoder_lora_step"]
    inputs = {v.name: v for v in model.graph.inputs}
    attentions: set[str] = set()
    for layer in range(4):
        assert not any(IO.lora_input(layer, p, "up") in inputs for p in DOWN_GROUPS["qkv_proj"])
        up = inputs[IO.lora_input(layer, "qkv_proj", "up")]
        assert up.const_value is None and up.shape[0] == "lora_rank_qkv_proj"
        (delta, _), = up.uses()
        (add, _), = delta.outputs[0].uses()
        packed = add.inputs[1].producer().inputs[0].producer()  # through the 2-D Reshape
        assert (delta.op_type, add.op_type, packed.op_type) == ("MatMul", "Add", "MatMulNBits")
        assert packed.attributes["N"].as_int() == up.shape[1] and len(packed.inputs) == 3
        assert [v.producer().op_type for v in packed.inputs[1:3]] == ["Concat", "Concat"]
        assert all(len(v.producer().inputs) == 3 and all(w.const_value is not None for w in v.producer().inputs)
                   for v in packed.inputs[1:3])
        (split, _), = add.outputs[0].uses()
        assert split.op_type == "Split"
        # q, k and v (each through its Reshape) into one layer's attention, written out (fusion.step_attention:
        # direct, its nodes named after the GroupQueryAttention they replace)
        readers = {v.uses()[0][0].outputs[0].uses()[0][0].name for v in split.outputs}
        attention = {name.rsplit("/direct/", 1)[0] for name in readers if "/direct/" in name}
        assert len(readers) == 3 and len(attention) == 1 and attention.isdisjoint(attentions)
        attentions |= attention
        low = low_of(inputs, layer, "qkv_proj", True, bits=4)
        assert delta.inputs[0].producer().inputs[0] is low.outputs[0]
        norm = packed.inputs[0]
        readers = [u for u, _ in norm.uses()]
        assert sorted(u.name for u in readers) == sorted([packed.name, low.name, f"{low.name}/spare"])
        spare = next(u for u in readers if u.name.endswith("/spare"))
        assert spare.inputs[1] is low.inputs[1] and not spare.outputs[0].uses()
        assert not spare.inputs[2].const_value.numpy().any()
        keys = ("bits", "block_size", "accuracy_level")
        assert all(u.attributes[k].as_int() == packed.attributes[k].as_int() for u in readers for k in keys)
    assert not any(n.name.endswith("qkv_proj/norm") for n in model.graph)


def test_the_step_form_joins_o_and_down_to_their_downs(sites, tmp_path):
    """The step form's o and down (lora.joint_downs) in the example's build: one MatMulNBits of
    `lora.{i}.{group}.joint_codes` and `.joint_scales` (the projection's quantization, its width rounded up to 32 plus
    the rank) gives y and x @ down side by side, and an 8-bit MatMulNBits of `lora.{i}.{proj}.up_codes` /
    `.up_scales` at accuracy level 0 reads it alone and gives what read y; the manifest's lora_layout holds their
    records, their base rows in the decoder's weights file. What they compute: tests/test_lora_passes.py."""
    model = adapted_graphs(sites["with"], tmp_path)["decoder_lora_step"]
    manifest = load_manifest(sites["with"] / "model")
    layout = manifest["variants"]["fp32"]["lora_layout"]
    assert sorted(n for n, r in layout.items() if r["kind"] == "joint_down") == sorted(
        IO.lora_input(i, g, f) for i in range(4) for g in JOINT_DOWNS for f in (JOINT_CODES, JOINT_SCALES))
    inputs = {v.name: v for v in model.graph.inputs}
    for layer, group in itertools.product(range(4), JOINT_DOWNS):
        proj = DOWN_GROUPS[group][0]
        e = layout[IO.lora_input(layer, group, JOINT_CODES)]
        assert e["base"]["location"] == manifest["variants"]["fp32"]["decoder_data"]
        assert not any(IO.lora_input(layer, group, f) in inputs for f in ("down", DOWN_CODES, DOWN_SCALES))
        assert IO.lora_input(layer, proj, "up") not in inputs
        codes, scales = (inputs[IO.lora_input(layer, group, f)] for f in (JOINT_CODES, JOINT_SCALES))
        (joint, at), = scales.uses()
        assert (joint.op_type, at, joint.inputs[1]) == ("MatMulNBits", 2, codes)
        width = joint.attributes["N"].as_int()
        assert width == e["dims"][0] == codes.shape[0] >= e["rows"] + shared_rank(group)
        (up, at), = joint.outputs[0].uses()
        assert (up.op_type, at, up.inputs[1].name, up.inputs[2].name) == \
            ("MatMulNBits", 0, IO.lora_input(layer, proj, UP_CODES), IO.lora_input(layer, proj, UP_SCALES))
        attrs = {k: up.attributes[k].as_int() for k in ("K", "bits", "block_size", "accuracy_level")}
        assert attrs == {"K": width, "bits": 8, "block_size": 32, "accuracy_level": 0}
        assert up.outputs[0].uses()


@needs_espeak
def test_q_k_v_left_unpacked_keep_the_pages_4_bit_down(sites, tmp_path):
    """Where q, k and v cannot be packed (here layer 0's k quantized at another accuracy level), the step form keeps
    their Gemms, and their down is still read as the page writes it (4-bit codes, as its layout record
    says), on its copy of the norm, with the two spares that make that copy and the down one fused kernel."""
    from webbuild.forms.step import write_step
    from webbuild.pipeline.check import StepForm
    from webbuild.train.target import heldout_target

    graphs = adapted_graphs(sites["with"], tmp_path)
    model = graphs["decoder_lora"]
    k_proj = model.graph.node("lora/0/k_proj/y2").inputs[0].producer()  # what k's update reshapes
    assert k_proj.op_type == "MatMulNBits"
    k_proj.attributes["accuracy_level"] = ir.AttrInt64("accuracy_level", 4)
    roles = load_manifest(sites["with"] / "model")["variants"]["fp32"]
    name = Path(roles["decoder_lora"]).stem + ".unpacked.onnx"
    ir.save(model, tmp_path / name)
    layout: dict[str, dict] = {}
    step = ir.load(tmp_path / write_step(tmp_path, name, layout).file)
    inputs = {v.name: v for v in step.graph.inputs}
    assert all(IO.lora_input(0, p, "up") in inputs for p in DOWN_GROUPS["qkv_proj"])
    assert IO.lora_input(0, "qkv_proj", "up") not in inputs and IO.lora_input(1, "qkv_proj", "up") in inputs
    low = low_of(inputs, 0, "qkv_proj", True, bits=4)
    assert len(inputs[IO.lora_input(0, "qkv_proj", DOWN_CODES)].uses()) == 1  # spares of zero codes
    assert len(inputs[IO.lora_input(1, "qkv_proj", DOWN_CODES)].uses()) == 2  # packed: one spare of its codes
    assert low.name == "lora/0/qkv_proj/low4"
    assert_alone_with_two_spares(low)
    manifest = load_manifest(sites["with"] / "model")
    reassemble(sites["with"] / "model", manifest, "runtime.json", tmp_path / "runtime.json")
    klatt = load_transcriber(sites["with"], adapter="klatt")
    form = StepForm(cpu_form(tmp_path / write_step(tmp_path, name).file),
                    json.loads((tmp_path / "runtime.json").read_text())["max_positions"], klatt.decoder, layout)
    clip = heldout_target("klatt", 1).clip(0)
    assert form.generate(klatt, clip, 40) == klatt.generate(clip, 40)  # fed as the page feeds it


def assert_alone_with_two_spares(low: ir.Node) -> None:
    """`low`, a 4-bit down, reads a copy of a norm with two spares (lora.spare_readers) and nothing else:
    MatMulNBits of the same quantization, narrower than the down and of one width, with zero codes and scales
    that are initializers of their own (onnxruntime's CSE would merge equal spares), read by nothing."""
    norm = low.inputs[0].producer()
    assert norm.op_type in ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"), low.name
    assert norm.name.startswith("lora/") and norm.name.endswith("/norm"), norm.name  # _branch_norm's copy
    spares = [u for u, _ in norm.outputs[0].uses() if u is not low]
    assert sorted(u.name for u in spares) == [f"{low.name}/spare", f"{low.name}/spare2"]
    keys = ("K", "bits", "block_size", "accuracy_level")
    widths = {u.attributes["N"].as_int() for u in spares}
    assert len(widths) == 1 and widths.pop() < low.attributes["N"].as_int(), low.name
    for u in spares:
        assert all(u.attributes[k].as_int() == low.attributes[k].as_int() for k in keys) and len(u.inputs) == 3
        assert not u.outputs[0].uses() and all(not v.const_value.numpy().any() for v in u.inputs[1:])
    assert len({id(v) for u in spares for v in u.inputs[1:]}) == 4


def low_of(inputs: dict[str, ir.Value], layer: int, group: str, step: bool, bits: int = 8) -> ir.Node:
    """The node giving x @ down of a group: a MatMul by the down input, or in the step form (lora.quantized_downs)
    a `bits`-bit MatMulNBits of its codes and scales inputs, the down's float input gone."""
    if not step:
        down = inputs[IO.lora_input(layer, group, "down")]
        assert down.const_value is None  # a graph input without a default
        (low, _), = down.uses()
        return low
    assert IO.lora_input(layer, group, "down") not in inputs
    codes, scales = (inputs[IO.lora_input(layer, group, f)] for f in (DOWN_CODES, DOWN_SCALES))
    assert codes.const_value is None and scales.const_value is None
    (low, at), = scales.uses()
    assert (low.op_type, at) == ("MatMulNBits", 2) and low.inputs[1] is codes  # a 4-bit one's spare reads codes too
    attrs = {k: low.attributes[k].as_int() for k in ("K", "N", "bits", "block_size", "accuracy_level")}
    rank, blocks = shared_rank(group), -(-attrs["K"] // 32)
    assert attrs == {"K": attrs["K"], "N": rank, "bits": bits, "block_size": 32, "accuracy_level": 0}
    assert codes.dtype == ir.DataType.UINT8 and list(codes.shape) == [rank, blocks, 32 * bits // 8]
    assert list(scales.shape) == [rank, blocks]
    return low


@needs_espeak
def test_the_step_form_gives_gate_and_up_their_merged_updates_as_biases(sites, tmp_path):
    """One token a step, so the step form adds gate's and up's updates as their MatMulNBits' bias
    (lora.mlp_updates_as_biases) and the post-attention norm feeds the two alone: onnxruntime-web's
    norm + gate/up + SiLU x up kernel takes biases. Each bias is a 4-bit MatMulNBits of the merged update's inputs
    (`lora.{i}.{proj}.delta_codes` / `.delta_scales`, lora.merged_deltas) on the norm's copy, beside one
    narrow spare: onnxruntime-web's norm + Q/K/V kernel for the three. The group's down and ups are no step inputs.
    Decoded on onnxruntime CPU with the example's adapter on (a real one; the build's check feeds a random one), the
    step form gives the plain adapted decoder's tokens."""
    from webbuild.pipeline.check import StepForm
    from webbuild.train.target import heldout_target

    graphs = adapted_graphs(sites["with"], tmp_path)
    step = graphs["decoder_lora_step"].graph
    inputs = {v.name: v for v in step.inputs}
    biased = [n for n in step if n.op_type == "MatMulNBits" and len(n.inputs) == 6 and "qkv_proj" not in n.name]
    assert len(biased) == 8, [n.name for n in biased]  # gate and up of each layer
    for layer in range(4):
        norm = biased[2 * layer].inputs[0].producer()
        assert norm.op_type == "SkipSimplifiedLayerNormalization"
        assert sorted(u.op_type for u, _ in norm.outputs[0].uses()) == ["MatMulNBits"] * 2
        assert len(norm.outputs[3].uses()) <= 1  # the residual goes on to the next norm, read by nothing else
        assert not any(IO.lora_input(layer, f, "up") in inputs for f in DOWN_GROUPS["gate_up_proj"])
        assert not any(IO.lora_input(layer, "gate_up_proj", f) in inputs for f in ("down", DOWN_CODES, DOWN_SCALES))
        merged = []
        for proj_node, proj in zip(biased[2 * layer:2 * layer + 2], DOWN_GROUPS["gate_up_proj"]):
            bias = proj_node.inputs[5].producer()
            delta = bias.inputs[0].producer()
            codes, scales = (inputs[IO.lora_input(layer, proj, f)] for f in (DELTA_CODES, DELTA_SCALES))
            assert (bias.op_type, delta.op_type, delta.inputs[1], delta.inputs[2]) == \
                ("Reshape", "MatMulNBits", codes, scales)
            attrs = {k: delta.attributes[k].as_int() for k in ("K", "N", "bits", "block_size", "accuracy_level")}
            n_in, n_out = proj_node.attributes["K"].as_int(), proj_node.attributes["N"].as_int()
            assert attrs == {"K": n_in, "N": n_out, "bits": 4, "block_size": 32, "accuracy_level": 0}
            assert list(codes.shape) == [n_out, n_in // 32, 16] and list(scales.shape) == [n_out, n_in // 32]
            merged.append(delta)
        copy = merged[0].inputs[0].producer()
        assert copy.name == f"lora/{layer}/gate_up_proj/norm" and merged[1].inputs[0] is merged[0].inputs[0]
        (spare,) = [u for u, _ in copy.outputs[0].uses() if u not in merged]
        assert spare.attributes["N"].as_int() < merged[0].attributes["N"].as_int() and not spare.outputs[0].uses()
        assert all(spare.attributes[k].as_int() == merged[0].attributes[k].as_int()
                   for k in ("K", "bits", "block_size", "accuracy_level"))
    assert not any(n.name.split("/")[2:3] in (["gate_proj"], ["up_proj"]) and n.op_type == "Add" for n in step)
    manifest = load_manifest(sites["with"] / "model")
    reassemble(sites["with"] / "model", manifest, "runtime.json", tmp_path / "runtime.json")
    max_positions = json.loads((tmp_path / "runtime.json").read_text())["max_positions"]
    klatt = load_transcriber(sites["with"], adapter="klatt")
    form = StepForm(cpu_form(tmp_path / manifest["variants"]["fp32"]["decoder_lora_step"]), max_positions,
                    klatt.decoder, manifest["variants"]["fp32"]["lora_layout"])
    assert form.adapter, "the step form is fed the adapter"
    base = load_transcriber(sites["with"])
    clips = heldout_target("klatt", 3)  # Klatt-voice speech, where the adapter changes the tokens
    tokens = [klatt.generate(clips.clip(i), 40) for i in range(3)]
    assert tokens != [base.generate(clips.clip(i), 40) for i in range(3)]
    assert [form.generate(klatt, clips.clip(i), 40) for i in range(3)] == tokens


def adapted_graphs(site: Path, tmp_path: Path) -> dict[str, ir.Model]:
    """The fp32 variant's adapted graphs by role, reassembled into `tmp_path` (weights file included)."""
    manifest = load_manifest(site / "model")
    roles = manifest["variants"]["fp32"]
    for name in roles["files"]:
        reassemble(site / "model", manifest, name, tmp_path / name)
    return {role: ir.load(tmp_path / roles[role]) for role in ADAPTED}


def test_onnxruntime_fuses_each_up_matmul_with_its_add(sites, tmp_path):
    """The point of the 2-D form: onnxruntime's MatMulAddFusion (2-D A and B, the Add's other input [M, N] of
    the same M) makes each projection's up MatMul + Add one Gemm, in every adapted graph (docs/adapters.md,
    Cost), but for the step form's gate and up, whose merged updates are biases (no up input left), and o and down;
    the step form's q, k and v have one Gemm for the three, and the packed projection's Concats of weights are folded
    into one initializer. Checked on the model onnxruntime's CPU EP writes after its optimizer. The step form's o and
    down have no Gemm: their update is an 8-bit MatMulNBits (test_the_step_form_joins_o_and_down_to_their_downs)."""
    import onnxruntime as ort

    adapted_graphs(sites["with"], tmp_path)
    roles = load_manifest(sites["with"] / "model")["variants"]["fp32"]
    for role in ADAPTED:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(tmp_path / f"{role}.optimized.onnx")
        ort.InferenceSession(str(cpu_form(tmp_path / roles[role])), options, providers=["CPUExecutionProvider"])
        nodes = list(ir.load(options.optimized_model_filepath).graph)
        ups = {n.op_type for n in nodes for v in n.inputs if v is not None and v.name.endswith(".up")}
        step = role == "decoder_lora_step"  # merged biases: gate's and up's; one Gemm for q, k and v
        biases = len(DOWN_GROUPS["gate_up_proj"]) if step else 0  # and none for o and down (joint_downs)
        gemms = len(TARGET_MODULES) - biases - (len(DOWN_GROUPS["qkv_proj"]) - 1 + len(JOINT_DOWNS) if step else 0)
        assert ups == {"Gemm"}, role
        assert not (step and any(n.op_type == "MatMul" and n.name.startswith("lora/") for n in nodes)), role
        assert sum(n.op_type == "Gemm" for n in nodes) == 4 * gemms, role
        assert not any(n.op_type in ("Add", "Concat") and n.name.startswith("lora/") for n in nodes), role


def decoders(site: Path, tmp_path: Path) -> tuple[IdsDecoder, IdsDecoder, dict]:
    manifest = load_manifest(site / "model")
    roles = manifest["variants"]["fp32"]
    for name in roles["files"]:
        reassemble(site / "model", manifest, name, tmp_path / name)
    runtime = {"num_key_value_heads": 2, "head_dim": 64, "hidden_size": 256}
    return (IdsDecoder(cpu_form(tmp_path / roles["decoder"]), runtime),
            IdsDecoder(cpu_form(tmp_path / roles["decoder_lora"]), runtime), manifest)


def test_adapted_decoder_without_adapter_is_the_base(sites, tmp_path):
    """Fed empty lora.* inputs (IdsDecoder without an adapter) the adapted graph adds zeros: the base model's
    logits exactly; with the
    int8 adapter, logits near those of the adapter's float weights."""
    from webbuild.reference.prompt import Prompt

    base, adapted, manifest = decoders(sites["with"], tmp_path)
    prompt = Prompt(ids=[1025, 7, 8, 1029, 1029, 1028, 9], audio_offset=3, audio_tokens=2)
    audio = np.random.default_rng(1).normal(size=(1, 2, 256)).astype(np.float32)
    logits = base.prefill(prompt, audio)[0]
    np.testing.assert_array_equal(adapted.prefill(prompt, audio)[0], logits)
    entry = manifest["adapters"]["klatt"]
    reassemble(sites["with"] / "model", manifest, entry["file"], tmp_path / entry["file"])
    adapted.adapter = unpack((tmp_path / entry["file"]).read_bytes(), entry["tensors"], "int8")
    with_int8 = adapted.prefill(prompt, audio)[0]
    adapted.adapter = graph_inputs(KLATT, num_layers=4, scale=entry["scale"])
    with_float = adapted.prefill(prompt, audio)[0]
    assert np.abs(with_float - logits).max() > 0.5  # the adapter changes the answer's logits
    assert np.abs(with_int8 - with_float).max() < 0.05 * np.abs(with_float - logits).max()


@needs_espeak
def test_transcribe_with_adapter_on_and_off(sites):
    """`webbuild transcribe SITE --adapter klatt`: the adapter's graphs and weights. The base keeps its
    transcripts of the example's clips without --adapter; on held-out Klatt-voice speech (never a training
    sentence) the adapter makes fewer errors than the base."""
    from webbuild.reference.wer import corpus_wer
    from webbuild.train.target import heldout_target

    base = load_transcriber(sites["with"])
    klatt = load_transcriber(sites["with"], adapter="klatt")
    samples = [read_wav(p) for p in SAMPLES]
    assert [base.generate(c) for c in samples] == [load_transcriber(sites["without"]).generate(c) for c in samples]
    clips = heldout_target("klatt", 6)
    texts = {name: [(t, r.transcribe(clips.clip(i))) for i, t in enumerate(clips.texts)]
             for name, r in (("base", base), ("klatt", klatt))}
    assert corpus_wer(texts["klatt"]) < corpus_wer(texts["base"]) - 0.2, texts


def test_transcribe_adapter_errors(sites):
    runner = CliRunner()
    unknown = runner.invoke(main, ["transcribe", str(sites["with"]), str(SAMPLES[0]), "--adapter", "nope"])
    assert unknown.exit_code == 2 and "no adapter 'nope'; the site has klatt" in unknown.output
    none = runner.invoke(main, ["transcribe", str(sites["without"]), str(SAMPLES[0]), "--adapter", "klatt"])
    assert none.exit_code == 2 and "the site has none" in none.output
    source = runner.invoke(main, ["transcribe", str(EXAMPLE / "model"), str(SAMPLES[0]), "--adapter", "klatt"])
    assert source.exit_code == 2 and "--adapter needs a built site" in source.output


def test_decoder_without_projections_is_a_clear_build_error(tmp_path):
    """A decoder whose layers do not show the seven projections apart: the build stops, naming why."""
    graph = ir.Graph([], [], nodes=[], name="g")
    with pytest.raises(NoProjections, match="no GroupQueryAttention"):
        find_projections(graph)


@pytest.mark.torch  # webbuild.zoo needs the zoo extra
def test_random_adapter_fits_its_export(tmp_path):
    """webbuild.zoo.random_adapter (the benchmarks' adapter for untrained zoo models) passes the build's
    checks and changes the reference's logits."""
    from webbuild.adapters import adapter_problems
    from webbuild.zoo.random_adapter import random_adapter

    folder = random_adapter(EXAMPLE / "model", tmp_path / "rand", seed=3)
    assert adapter_problems(folder, json.loads((EXAMPLE / "model" / "config.json").read_text())) == []
    inputs = graph_inputs(folder, num_layers=4)
    assert all(np.abs(w).max() > 0 for w in inputs.values())


def test_wasm_plan_counts_the_adapted_session(sites):
    """On wasm the adapted decoder is a second session holding the decoder's weights: the plan counts it."""
    need = {k: json.loads((sites[k] / "build-report.json").read_text())["variants"]["fp32"]["wasm"]
            for k in ("with", "without")}
    assert need["with"]["forms"] == need["without"]["forms"]
    assert need["with"]["tensor_bytes"] > need["without"]["tensor_bytes"]
    assert need["with"]["need_bytes"] > need["without"]["need_bytes"]


@pytest.mark.parametrize("sabotage", ["packed_up", "delta"])
def test_the_check_fails_a_wrong_adapter_packing(sites, tmp_path, sabotage):
    """The check stage's random adapter (check.RoleCheck.adapter_values): the adapted step form as built gives the
    plain adapted decoder's logits with it, within the tolerance; with its layout wrong (a packing bug: q/k/v's packed
    up made of their ups in another order, or gate's merged update made from up's up) it does not, and says so."""
    from webbuild.pipeline.check import RoleCheck
    from webbuild.pipeline.state import Variant

    manifest = load_manifest(sites["with"] / "model")
    entry = manifest["variants"]["fp32"]
    folder = tmp_path / "fp32"
    folder.mkdir()
    for name in entry["files"]:
        reassemble(sites["with"] / "model", manifest, name, folder / name)
    reassemble(sites["with"] / "model", manifest, "runtime.json", tmp_path / "runtime.json")
    roles = {role: name for role, name in entry.items() if isinstance(name, str) and name in entry["files"]}
    layout = json.loads(json.dumps(entry["lora_layout"]))
    clips = {p.name: read_wav(p) for p in SAMPLES[:2]}
    max_positions = json.loads((tmp_path / "runtime.json").read_text())["max_positions"]

    def check(layout: dict) -> dict:
        v = Variant("fp32", folder, roles, lora_layout=layout)
        scratch = tmp_path / f"scratch{len(list(tmp_path.glob('scratch*')))}"
        return RoleCheck(v, EXAMPLE / "model", scratch, clips, None, max_positions,
                         manifest["adapters"]["klatt"]["rank"]).adapter_values("decoder_lora_step")

    good = check(layout)
    assert good["values_equal"] and not good["problems"]
    assert good["random_adapter"]["difference"] < 0.25 * good["random_adapter"]["effect"]
    for record in layout.values():
        if sabotage == "packed_up" and record["kind"] == "packed_up":
            record["from"] = record["from"][::-1]
        if sabotage == "delta" and record["kind"] == "delta" and record["from"][1].endswith(".gate_proj.up"):
            record["from"][1] = record["from"][1].replace(".gate_proj.", ".up_proj.")
    bad = check(layout)
    assert not bad["values_equal"] and "a random adapter: logits" in bad["problems"][0]

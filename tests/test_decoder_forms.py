"""webbuild.forms.decoder: the WebGPU form and its wasm twin written once into the forms folder, both
reading the same weights file, and the CPU form the Python reference runs."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import onnx
import pytest

from webbuild.config import Quantize
from webbuild.forms.decoder import decoder_forms
from webbuild.forms.webgpu import norms_out_of_gqa
from webbuild.fusion.fuse_decoder import fuse_decoder, save
from webbuild.fusion.parity import MergedRunner, compare, embed_table
from webbuild.quantize.quantize_matmuls import quantize_matmuls
from webbuild.reference.transcribe import cpu_form

EXAMPLE_MODEL = Path(__file__).resolve().parents[1] / "examples" / "tiny-asr" / "model"


@pytest.fixture(scope="module")
def fused(tmp_path_factory) -> Path:
    model, _ = fuse_decoder(EXAMPLE_MODEL)
    return save(model, tmp_path_factory.mktemp("fused"))


def ops(path: Path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]


def locations(path: Path) -> set[str]:
    model = onnx.load(str(path), load_external_data=False)
    return {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def forms_of(src: Path, dest: Path, wasm_twin: bool, accuracy_level: int | None = None) -> dict[str, str]:
    """decoder_forms of `src` into `dest`, its weights file copied there first as the forms stage does."""
    dest.mkdir(exist_ok=True)
    shutil.copyfile(src.with_name(src.name + ".data"), dest / (src.name + ".data"))
    return decoder_forms(src, dest, src.name, wasm_twin, accuracy_level, wasm_form="float")


def test_webgpu_form_written_once_with_the_explicit_graph_as_wasm_twin(fused, tmp_path):
    explicit, data = digest(fused), digest(fused.with_name("decoder.onnx.data"))
    assert forms_of(fused, tmp_path / "forms", wasm_twin=True) == {"graph": "decoder.onnx",
                                                                     "wasm": "decoder.wasm.onnx"}
    webgpu = ops(tmp_path / "forms" / "decoder.onnx")
    assert webgpu.count("SimplifiedLayerNormalization") == 1 and len(webgpu) == len(ops(fused)) - 6 * 4
    assert digest(tmp_path / "forms" / "decoder.wasm.onnx") == explicit  # unquantized: no lookup to rewrite
    assert digest(tmp_path / "forms" / "decoder.onnx.data") == data  # the weights file is shared, untouched
    assert locations(tmp_path / "forms" / "decoder.onnx") == locations(fused) == {"decoder.onnx.data"}
    assert digest(fused) == explicit  # the source graph is never rewritten


def test_no_twin_for_fp16_and_the_graph_shipped_as_it_is_without_norms_to_move(fused, tmp_path):
    assert forms_of(fused, tmp_path / "once", wasm_twin=False) == {"graph": "decoder.onnx"}
    assert sorted(p.name for p in (tmp_path / "once").iterdir()) == ["decoder.onnx", "decoder.onnx.data"]
    webgpu = tmp_path / "once" / "decoder.onnx"
    assert forms_of(webgpu, tmp_path / "twice", wasm_twin=False) == {"graph": "decoder.onnx"}
    assert digest(tmp_path / "twice" / "decoder.onnx") == digest(webgpu)  # already the WebGPU form
    assert not norms_out_of_gqa(fused, tmp_path / "unused.onnx") and not (tmp_path / "unused.onnx").exists()


def test_cpu_form_runs_on_onnxruntime_cpu_like_the_fused_graph(fused, tmp_path):
    forms_of(fused, tmp_path, wasm_twin=False)
    cpu = cpu_form(tmp_path / "decoder.onnx")
    assert cpu.name == "decoder.cpu.onnx" and ops(cpu).count("SimplifiedLayerNormalization") == 9
    result = compare(MergedRunner(fused), MergedRunner(cpu), embed_table(EXAMPLE_MODEL))
    assert result["max_rel_err"] == 0.0 and result["tokens_equal"]
    assert cpu_form(fused) == fused  # an explicit graph is used as it is


def levels(path: Path) -> set[int]:
    model = onnx.load(str(path), load_external_data=False)
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    return {a.i for n in nbits for a in n.attribute if a.name == "accuracy_level"}


@pytest.mark.parametrize("level", [0, 4, None])
def test_webgpu_form_takes_its_own_accuracy_level_and_the_twin_keeps_the_quantized_one(fused, tmp_path, level):
    quantized = quantize_matmuls(onnx.load(str(fused)), Quantize(accuracy_level=4))
    onnx.save(quantized, str(tmp_path / "decoder.onnx"), save_as_external_data=True, location="decoder.onnx.data")
    forms = forms_of(tmp_path / "decoder.onnx", tmp_path / "forms", wasm_twin=True, accuracy_level=level)
    assert levels(tmp_path / "forms" / "decoder.onnx") == {4 if level is None else level}
    assert levels(tmp_path / "decoder.onnx") == {4}  # the quantized graph is left as it is
    assert forms["wasm"] == "decoder.wasm.onnx" and levels(tmp_path / "forms" / forms["wasm"]) <= {4}  # may fold

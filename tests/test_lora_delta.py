"""The delta graph (webbuild.forms.lora_delta), which the page runs at an adapter switch, makes the merged updates
the adapted step form reads (lora.merged_deltas) as the Python reference does (adapter_pack.delta_inputs): run
here on onnxruntime CPU, for both float types and every DELTA_GROUPS member."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from webbuild.adapters import DOWN_GROUPS
from webbuild.forms.form import Made, Miss
from webbuild.forms.lora_delta import (
    delta_graph,
    delta_name,
    differences,
    random_layer,
    run_layer,
    write_delta_graph,
)
from webbuild.site.adapter_pack import delta_inputs
from webbuild.site.contract import DELTA_CODES, DELTA_GROUPS, DELTA_SCALES, IO

TYPES = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}
MEMBERS = [p for g in DELTA_GROUPS for p in DOWN_GROUPS[g]]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_the_delta_graph_makes_what_delta_inputs_makes(dtype):
    inputs = random_layer(256, dict.fromkeys(MEMBERS, 96), 32, seed=7)
    expected, got = delta_inputs(inputs, dtype), run_layer(delta_graph(TYPES[dtype]), inputs)
    assert sorted(got) == sorted(expected) == sorted(
        IO.lora_input(0, p, f) for p in MEMBERS for f in (DELTA_CODES, DELTA_SCALES))
    assert differences(got, expected) == []
    # what differences tells apart: a code two steps off, a scale off, a shape
    name = IO.lora_input(0, MEMBERS[0], DELTA_CODES)
    off = dict(got, **{name: got[name] ^ 2, IO.lora_input(0, MEMBERS[1], DELTA_SCALES): expected[
        IO.lora_input(0, MEMBERS[1], DELTA_SCALES)] * 2, IO.lora_input(0, MEMBERS[1], DELTA_CODES): got[name][:1]})
    assert len(differences(off, expected)) == 3


def test_a_zero_adapter_gives_zero_updates():
    inputs = {name: np.zeros_like(w) for name, w in random_layer(64, dict.fromkeys(MEMBERS, 32), 8).items()}
    for name, value in run_layer(delta_graph(), inputs).items():
        assert (value == (0x88 if name.endswith(DELTA_CODES) else 0)).all(), name


def test_the_delta_graph_is_written_only_for_a_step_that_reads_merged_updates(tmp_path):
    names = {"with": IO.lora_input(0, DOWN_GROUPS[DELTA_GROUPS[0]][0], DELTA_SCALES), "without": "input_ids"}
    for kind, name in names.items():
        graph = helper.make_graph([helper.make_node("Identity", [name], ["y"])], "step",
                                  [helper.make_tensor_value_info(name, TensorProto.FLOAT16, [2])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2])])
        onnx.save(helper.make_model(graph), str(tmp_path / f"{kind}.onnx"))
        made = write_delta_graph(tmp_path / f"{kind}.onnx", tmp_path / f"{kind}.delta.onnx")
        assert isinstance(made, Made) == (kind == "with") == (tmp_path / f"{kind}.delta.onnx").exists()
        assert kind == "with" or made == Miss("the adapted step form reads no merged update", loses=False)
    model = onnx.load(str(tmp_path / "with.delta.onnx"))
    assert model.graph.input[0].name == delta_name(DELTA_GROUPS[0], "down")
    assert {i.type.tensor_type.elem_type for i in model.graph.input} == {TensorProto.FLOAT16}  # the step's type

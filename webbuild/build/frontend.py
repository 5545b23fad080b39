"""The Qwen3-ASR log-mel front-end as an ONNX graph, prepended to an encoder that takes `mel`.

The built encoder then takes 16 kHz PCM, so the browser and the Python reference share one
implementation. The STFT is a strided Conv with a windowed DFT basis (402 output channels: real
and imaginary parts of 201 bins): plain Conv/MatMul work that every execution provider runs on the
GPU, where DFT/STFT operators often fall back to the CPU.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from webbuild.errors import BuildError
from webbuild.graph.load import load_onnx
from webbuild.reference.mel import HOP, N_FFT, hann_window, mel_filters

N_BINS = N_FFT // 2 + 1


def dft_basis() -> np.ndarray:
    """Conv weight [2*N_BINS, 1, N_FFT]: Hann-windowed cos rows, then -sin rows."""
    n = np.arange(N_FFT)[None, :]
    k = np.arange(N_BINS)[:, None]
    angle = 2 * np.pi * k * n / N_FFT
    basis = np.concatenate([np.cos(angle), -np.sin(angle)]) * hann_window()[None, :]
    return basis[:, None, :].astype(np.float32)


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def mel_graph(opset: int) -> onnx.ModelProto:
    """pcm [1, N] float32 -> mel [1, 128, N // 160], equal to `webbuild.reference.mel.log_mel`."""
    inits = [
        _const("fe_pads", np.array([0, 0, N_FFT // 2, 0, 0, N_FFT // 2], np.int64)),
        _const("fe_basis", dft_basis()),
        _const("fe_filters", mel_filters().T.copy()),  # [128, 201]
        _const("fe_split", np.array([N_BINS, N_BINS], np.int64)),
        _const("fe_start", np.array([0], np.int64)),
        _const("fe_minus1", np.array([-1], np.int64)),
        _const("fe_axis2", np.array([2], np.int64)),
        _const("fe_floor", np.array(1e-10, np.float32)),
        _const("fe_inv_ln10", np.array(1 / np.log(10), np.float32)),
        _const("fe_range", np.array(8.0, np.float32)),
        _const("fe_four", np.array(4.0, np.float32)),
        _const("fe_quarter", np.array(0.25, np.float32)),
        _const("fe_axis1", np.array([1], np.int64)),
    ]
    nodes = [
        helper.make_node("Unsqueeze", ["pcm", "fe_axis1"], ["fe_pcm3"]),  # [1, 1, N]
        helper.make_node("Pad", ["fe_pcm3", "fe_pads"], ["fe_padded"], mode="reflect"),
        helper.make_node("Conv", ["fe_padded", "fe_basis"], ["fe_spec"], strides=[HOP]),  # [1, 402, F]
        helper.make_node("Split", ["fe_spec", "fe_split"], ["fe_re", "fe_im"], axis=1),
        helper.make_node("Mul", ["fe_re", "fe_re"], ["fe_re2"]),
        helper.make_node("Mul", ["fe_im", "fe_im"], ["fe_im2"]),
        helper.make_node("Add", ["fe_re2", "fe_im2"], ["fe_power_all"]),
        # the last frame is dropped, as the reference does
        helper.make_node("Slice", ["fe_power_all", "fe_start", "fe_minus1", "fe_axis2"], ["fe_power"]),
        helper.make_node("MatMul", ["fe_filters", "fe_power"], ["fe_mel"]),  # [1, 128, T]
        helper.make_node("Max", ["fe_mel", "fe_floor"], ["fe_clamped"]),
        helper.make_node("Log", ["fe_clamped"], ["fe_ln"]),
        helper.make_node("Mul", ["fe_ln", "fe_inv_ln10"], ["fe_log10"]),
        helper.make_node("ReduceMax", ["fe_log10"], ["fe_peak"], keepdims=0),
        helper.make_node("Sub", ["fe_peak", "fe_range"], ["fe_low"]),
        helper.make_node("Max", ["fe_log10", "fe_low"], ["fe_floored"]),
        helper.make_node("Add", ["fe_floored", "fe_four"], ["fe_shift"]),
        helper.make_node("Mul", ["fe_shift", "fe_quarter"], ["mel"]),
    ]
    graph = helper.make_graph(
        nodes, "mel_frontend",
        [helper.make_tensor_value_info("pcm", TensorProto.FLOAT, [1, "samples"])],
        [helper.make_tensor_value_info("mel", TensorProto.FLOAT, [1, 128, "frames"])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def add_mel_frontend(encoder_in: Path, encoder_out: Path) -> None:
    """Write `encoder_out`: `encoder_in` (input `mel`) with the front-end in front (input `pcm`).

    The front-end's nodes and constants are spliced in ahead of the encoder's, whose `mel` input they
    produce. Only the graph is rewritten: weights in an external data file are not read (a 1.3 GB
    encoder would otherwise be copied several times over); the file is copied beside `encoder_out`
    as `<name>.data`. An inline encoder stays inline."""
    encoder = load_onnx(encoder_in)
    g = encoder.graph
    names = [i.name for i in g.input]
    if names != ["mel"]:
        raise BuildError(f"{encoder_in}: expected one input named 'mel', found {names}")
    opset = next(o.version for o in encoder.opset_import if o.domain in ("", "ai.onnx"))
    front = mel_graph(opset).graph
    clash = _names(front) & _names(g) - {"mel"}
    if clash:
        raise BuildError(f"{encoder_in}: names {sorted(clash)[:5]} clash with the mel front-end's")
    nodes = [*front.node, *g.node]
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(front.initializer)
    del g.input[:]
    g.input.extend(front.input)
    _move_external_data(encoder, Path(encoder_in), Path(encoder_out))
    onnx.save(encoder, str(encoder_out))
    onnx.checker.check_model(str(encoder_out))  # by path: external data is looked up beside the file


def _names(g: onnx.GraphProto) -> set[str]:
    return ({o for n in g.node for o in n.output} | {t.name for t in g.initializer} | {i.name for i in g.input}) - {""}


def _move_external_data(model: onnx.ModelProto, src: Path, dest: Path) -> None:
    """Point external tensors at `dest.name + '.data'` and copy `src`'s data file there."""
    entries = [e for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL
               for e in t.external_data if e.key == "location"]
    locations = {e.value for e in entries}
    if not locations:
        return
    if len(locations) > 1:
        raise BuildError(f"{src}: external data spread over {sorted(locations)}; expected one file")
    data = dest.with_name(dest.name + ".data")
    shutil.copyfile(src.parent / locations.pop(), data)
    for e in entries:
        e.value = data.name

"""The Qwen3-ASR log-mel front-end as an ONNX graph, prepended to an encoder that takes `mel`.

The built encoder then takes 16 kHz PCM, so the browser and the Python reference share one
implementation. The STFT is a strided Conv with a windowed DFT basis (402 output channels: real
and imaginary parts of 201 bins): plain Conv/MatMul work that every execution provider runs on the
GPU, where DFT/STFT operators often fall back to the CPU.

A lead goes before the PCM when asked (model.yaml `encoder.lead_ms`): fixed white noise at the
level of the chunk's quietest 10 ms window, as long as the lead less the background the chunk
already starts with (`webbuild.reference.mel.with_lead`), so every chunk the page sends starts as
the model learnt that speech starts, after a pause. The window energies are one more strided Conv
(ones), for the reason above; the first loud window is an ArgMax over the windows and one loud
sentinel. The lead is recorded in the graph's metadata (`LEAD_METADATA`), so the Python reference
knows how many audio tokens to expect.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from webbuild.errors import BuildError
from webbuild.forms.form import Form, Made
from webbuild.graph.load import load_onnx
from webbuild.reference.mel import (
    HOP,
    LEAD_METADATA,
    N_FFT,
    QUIET_RATIO,
    QUIET_WINDOW,
    hann_window,
    lead_noise,
    mel_filters,
)
from webbuild.site.contract import IO

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


def mel_graph(opset: int, lead: int = 0) -> onnx.ModelProto:
    """pcm [1, N] float32 -> mel [1, 128, (lead_length(pcm, lead) + N) // 160], equal to
    `webbuild.reference.mel.log_mel(pcm, lead)`."""
    if lead < 0:
        raise ValueError(f"lead must be 0 or more samples, got {lead}")
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
    signal, lead_nodes = "fe_pcm3", []
    if lead:  # without a lead the graph is the upstream front-end's, node for node
        signal = "fe_led"
        inits += [
            _const("fe_window_ones", np.ones((1, 1, QUIET_WINDOW), np.float32)),
            _const("fe_inv_window", np.array(1 / QUIET_WINDOW, np.float32)),
            _const("fe_quiet_ratio", np.array(QUIET_RATIO, np.float32)),
            _const("fe_sentinel", np.ones((1, 1, 1), np.float32)),
            _const("fe_window_len", np.array([QUIET_WINDOW], np.int64)),
            _const("fe_lead_len", np.array([lead], np.int64)),
            _const("fe_zero", np.array([0], np.int64)),
            _const("fe_shape1", np.array([1], np.int64)),
            _const("fe_lead_noise", lead_noise(lead)[None, None, :]),  # [1, 1, lead]
        ]
        lead_nodes = [
            helper.make_node("Mul", ["fe_pcm3", "fe_pcm3"], ["fe_sq"]),
            helper.make_node("Conv", ["fe_sq", "fe_window_ones"], ["fe_energy"], strides=[QUIET_WINDOW]),  # [1, 1, W]
            helper.make_node("ReduceMin", ["fe_energy"], ["fe_quiet_energy"], keepdims=1),  # [1, 1, 1]
            # how many windows the chunk starts with that are background: the first loud one's index
            helper.make_node("Mul", ["fe_quiet_energy", "fe_quiet_ratio"], ["fe_loud_above"]),
            helper.make_node("Greater", ["fe_energy", "fe_loud_above"], ["fe_loud"]),
            helper.make_node("Cast", ["fe_loud"], ["fe_loud_f"], to=TensorProto.FLOAT),
            helper.make_node("Concat", ["fe_loud_f", "fe_sentinel"], ["fe_loud_s"], axis=2),  # all quiet: W
            helper.make_node("ArgMax", ["fe_loud_s"], ["fe_first_loud"], axis=2, keepdims=0),  # [1, 1]
            helper.make_node("Reshape", ["fe_first_loud", "fe_shape1"], ["fe_first_loud1"]),  # [1]
            helper.make_node("Mul", ["fe_first_loud1", "fe_window_len"], ["fe_have"]),
            helper.make_node("Sub", ["fe_lead_len", "fe_have"], ["fe_need"]),
            helper.make_node("Max", ["fe_need", "fe_zero"], ["fe_lead_n"]),
            helper.make_node("Slice", ["fe_lead_noise", "fe_zero", "fe_lead_n", "fe_axis2"], ["fe_noise"]),
            helper.make_node("Mul", ["fe_quiet_energy", "fe_inv_window"], ["fe_quiet_power"]),
            helper.make_node("Sqrt", ["fe_quiet_power"], ["fe_quiet"]),
            helper.make_node("Mul", ["fe_noise", "fe_quiet"], ["fe_lead"]),
            helper.make_node("Concat", ["fe_lead", "fe_pcm3"], [signal], axis=2),  # [1, 1, lead_n + N]
        ]
    nodes = [
        helper.make_node("Unsqueeze", [IO.pcm, "fe_axis1"], ["fe_pcm3"]),  # [1, 1, N]
        *lead_nodes,
        helper.make_node("Pad", [signal, "fe_pads"], ["fe_padded"], mode="reflect"),
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
        helper.make_node("Mul", ["fe_shift", "fe_quarter"], [IO.mel]),
    ]
    graph = helper.make_graph(
        nodes, "mel_frontend",
        [helper.make_tensor_value_info(IO.pcm, TensorProto.FLOAT, [1, "samples"])],
        [helper.make_tensor_value_info(IO.mel, TensorProto.FLOAT, [1, 128, "frames"])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def add_mel_frontend(encoder_in: Path, encoder_out: Path, lead: int = 0) -> None:
    """Write `encoder_out`: `encoder_in` (input `mel`) with the front-end in front (input `pcm`),
    putting a lead of up to `lead` samples before the audio (`webbuild.reference.mel.with_lead`).

    The front-end's nodes and constants are spliced in ahead of the encoder's, whose `mel` input they
    produce. Only the graph is rewritten: weights in an external data file are not read (a 1.3 GB
    encoder would otherwise be copied several times over); the file is copied beside `encoder_out`
    as `<name>.data`. An inline encoder stays inline."""
    encoder = load_onnx(encoder_in)
    g = encoder.graph
    names = [i.name for i in g.input]
    if names != [IO.mel]:
        raise BuildError(f"{encoder_in}: expected one input named {IO.mel!r}, found {names}")
    opset = next(o.version for o in encoder.opset_import if o.domain in ("", "ai.onnx"))
    front = mel_graph(opset, lead).graph
    clash = _names(front) & _names(g) - {IO.mel}
    if clash:
        raise BuildError(f"{encoder_in}: names {sorted(clash)[:5]} clash with the mel front-end's")
    nodes = [*front.node, *g.node]
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(front.initializer)
    del g.input[:]
    g.input.extend(front.input)
    if lead:
        onnx.helper.set_model_props(encoder, {**{p.key: p.value for p in encoder.metadata_props},
                                              LEAD_METADATA: str(lead)})
    _move_external_data(encoder, Path(encoder_in), Path(encoder_out))
    onnx.save(encoder, str(encoder_out))
    onnx.checker.check_model(str(encoder_out))  # by path: external data is looked up beside the file


def write_mel_frontend(encoder_in: Path, encoder_out: Path, lead: int = 0) -> Made:
    """add_mel_frontend as a graph form (MEL_FRONTEND); what it cannot do is a BuildError, never a fallback."""
    add_mel_frontend(encoder_in, encoder_out, lead)
    return Made(encoder_out.name)


MEL_FRONTEND = Form("mel_frontend", "an encoder taking `mel`: the log-mel front-end put in front, so that it takes "
                    "16 kHz `pcm`", write_mel_frontend)


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

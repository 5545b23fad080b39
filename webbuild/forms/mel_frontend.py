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
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto

from webbuild.errors import BuildError
from webbuild.forms.form import Form, Made
from webbuild.graph.builder import Builder, new_model, value
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


def mel_graph(opset: int, lead: int = 0) -> onnx.ModelProto:
    """pcm [1, N] float32 -> mel [1, 128, (lead_length(pcm, lead) + N) // 160], equal to
    `webbuild.reference.mel.log_mel(pcm, lead)`."""
    return ir.serde.serialize_model(mel_model(opset, lead))


def mel_model(opset: int, lead: int = 0) -> ir.Model:
    """The front-end of mel_graph as an onnx-ir model: unnamed nodes, constants `fe_*`, values named."""
    if lead < 0:
        raise ValueError(f"lead must be 0 or more samples, got {lead}")
    model = new_model("mel_frontend", opset, onnx.IR_VERSION)
    b = Builder(model.graph, "fe_", typed_consts=False)
    consts = {
        "pads": np.array([0, 0, N_FFT // 2, 0, 0, N_FFT // 2], np.int64), "basis": dft_basis(),
        "filters": mel_filters().T.copy(),  # [128, 201]
        "split": np.array([N_BINS, N_BINS], np.int64), "start": np.array([0], np.int64),
        "minus1": np.array([-1], np.int64), "axis2": np.array([2], np.int64), "floor": np.array(1e-10, np.float32),
        "inv_ln10": np.array(1 / np.log(10), np.float32), "range": np.array(8.0, np.float32),
        "four": np.array(4.0, np.float32), "quarter": np.array(0.25, np.float32), "axis1": np.array([1], np.int64)}
    if lead:
        consts |= {
            "window_ones": np.ones((1, 1, QUIET_WINDOW), np.float32),
            "inv_window": np.array(1 / QUIET_WINDOW, np.float32),
            "quiet_ratio": np.array(QUIET_RATIO, np.float32), "sentinel": np.ones((1, 1, 1), np.float32),
            "window_len": np.array([QUIET_WINDOW], np.int64), "lead_len": np.array([lead], np.int64),
            "zero": np.array([0], np.int64), "shape1": np.array([1], np.int64),
            "lead_noise": lead_noise(lead)[None, None, :]}  # [1, 1, lead]
    values = {f"fe_{k}": b.const(k, v) for k, v in consts.items()}
    values[IO.pcm] = b.input(IO.pcm, ir.DataType.FLOAT, [1, "samples"])
    mel = value(IO.mel, ir.DataType.FLOAT, [1, 128, "frames"])

    def n(op: str, inputs: list[str], outputs: list[str], **attrs: Any) -> None:
        made = [mel if name == IO.mel else value(name) for name in outputs]
        b.node(op, [values[i] for i in inputs], "", made, **attrs)
        values.update(zip(outputs, made))

    n("Unsqueeze", [IO.pcm, "fe_axis1"], ["fe_pcm3"])  # [1, 1, N]
    signal = "fe_led" if lead else "fe_pcm3"  # without a lead the graph is the upstream front-end's, node for node
    if lead:
        n("Mul", ["fe_pcm3", "fe_pcm3"], ["fe_sq"])
        n("Conv", ["fe_sq", "fe_window_ones"], ["fe_energy"], strides=[QUIET_WINDOW])  # [1, 1, W]
        n("ReduceMin", ["fe_energy"], ["fe_quiet_energy"], keepdims=1)  # [1, 1, 1]
        # how many windows the chunk starts with that are background: the first loud one's index
        n("Mul", ["fe_quiet_energy", "fe_quiet_ratio"], ["fe_loud_above"])
        n("Greater", ["fe_energy", "fe_loud_above"], ["fe_loud"])
        n("Cast", ["fe_loud"], ["fe_loud_f"], to=ir.DataType.FLOAT)
        n("Concat", ["fe_loud_f", "fe_sentinel"], ["fe_loud_s"], axis=2)  # all quiet: W
        n("ArgMax", ["fe_loud_s"], ["fe_first_loud"], axis=2, keepdims=0)  # [1, 1]
        n("Reshape", ["fe_first_loud", "fe_shape1"], ["fe_first_loud1"])  # [1]
        n("Mul", ["fe_first_loud1", "fe_window_len"], ["fe_have"])
        n("Sub", ["fe_lead_len", "fe_have"], ["fe_need"])
        n("Max", ["fe_need", "fe_zero"], ["fe_lead_n"])
        n("Slice", ["fe_lead_noise", "fe_zero", "fe_lead_n", "fe_axis2"], ["fe_noise"])
        n("Mul", ["fe_quiet_energy", "fe_inv_window"], ["fe_quiet_power"])
        n("Sqrt", ["fe_quiet_power"], ["fe_quiet"])
        n("Mul", ["fe_noise", "fe_quiet"], ["fe_lead"])
        n("Concat", ["fe_lead", "fe_pcm3"], [signal], axis=2)  # [1, 1, lead_n + N]
    n("Pad", [signal, "fe_pads"], ["fe_padded"], mode="reflect")
    n("Conv", ["fe_padded", "fe_basis"], ["fe_spec"], strides=[HOP])  # [1, 402, F]
    n("Split", ["fe_spec", "fe_split"], ["fe_re", "fe_im"], axis=1)
    n("Mul", ["fe_re", "fe_re"], ["fe_re2"])
    n("Mul", ["fe_im", "fe_im"], ["fe_im2"])
    n("Add", ["fe_re2", "fe_im2"], ["fe_power_all"])
    # the last frame is dropped, as the reference does
    n("Slice", ["fe_power_all", "fe_start", "fe_minus1", "fe_axis2"], ["fe_power"])
    n("MatMul", ["fe_filters", "fe_power"], ["fe_mel"])  # [1, 128, T]
    n("Max", ["fe_mel", "fe_floor"], ["fe_clamped"])
    n("Log", ["fe_clamped"], ["fe_ln"])
    n("Mul", ["fe_ln", "fe_inv_ln10"], ["fe_log10"])
    n("ReduceMax", ["fe_log10"], ["fe_peak"], keepdims=0)
    n("Sub", ["fe_peak", "fe_range"], ["fe_low"])
    n("Max", ["fe_log10", "fe_low"], ["fe_floored"])
    n("Add", ["fe_floored", "fe_four"], ["fe_shift"])
    n("Mul", ["fe_shift", "fe_quarter"], [IO.mel])
    b.place()
    model.graph.outputs.append(mel)
    return model


def add_mel_frontend(encoder_in: Path, encoder_out: Path, lead: int = 0) -> None:
    """Write `encoder_out`: `encoder_in` (input `mel`) with the front-end in front (input `pcm`),
    putting a lead of up to `lead` samples before the audio (`webbuild.reference.mel.with_lead`).

    The front-end's nodes and constants (mel_model, built with webbuild.graph.builder) are spliced in ahead of
    the encoder's, whose `mel` input they produce. The splice works on the encoder's protobuf: an onnx-ir round
    trip would write a value_info for each of its initializers, changing the shipped encoder's bytes. Only the
    graph is rewritten: weights in an external data file are not read (a 1.3 GB encoder would otherwise be copied
    several times over); the file is copied beside `encoder_out` as `<name>.data`. An inline encoder stays
    inline."""
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

"""torch -> ONNX through either torch.onnx path, and weight sharing between graphs."""

from __future__ import annotations

import hashlib
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
import inspect

EXPORTERS = ("torchscript", "dynamo")
OPSET = {"torchscript": 17, "dynamo": 18}


def export_graph(module, args: tuple, exporter: str, input_names: list[str], output_names: list[str],
                 dynamic: dict[str, dict[int, str]]) -> onnx.ModelProto:
    """Export `module(*args)` and return the loaded ModelProto (weights in memory)."""
    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}; choose one of {', '.join(EXPORTERS)}")
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = Path(tmp) / "model.onnx"
        if exporter == "torchscript":
            torch.onnx.export(module, args, str(path), dynamo=False, input_names=input_names,
                              output_names=output_names, dynamic_axes=dynamic,
                              opset_version=OPSET[exporter], do_constant_folding=True)
        else:
            torch.onnx.export(module, args, str(path), dynamo=True, input_names=input_names,
                              output_names=output_names,
                              dynamic_shapes=_dynamic_shapes(module, args, input_names, dynamic),
                              opset_version=OPSET[exporter], external_data=True, optimize=True, verbose=False)
        return onnx.load(str(path), load_external_data=True)


def _dynamic_shapes(module, args, input_names, dynamic):
    """torch.export's dynamic_shapes mirroring forward's signature: a tuple for a `*args` tail."""
    dims: dict[str, torch.export.Dim] = {}

    def spec(name):
        axes = dynamic.get(name)
        if not axes:
            return None
        return {ax: dims.setdefault(label, torch.export.Dim.DYNAMIC) for ax, label in axes.items()}

    specs = [spec(name) for name in input_names[: len(args)]]
    params = list(inspect.signature(module.forward).parameters.values())
    var = [i for i, p in enumerate(params) if p.kind == inspect.Parameter.VAR_POSITIONAL]
    if var:
        specs = specs[: var[0]] + [tuple(specs[var[0]:])]
    return tuple(specs)


def _tensor_key(t: onnx.TensorProto, raw: bytes) -> str:
    return hashlib.sha256(raw + str((t.data_type, tuple(t.dims))).encode()).hexdigest()


def save_sharing_weights(models: dict[Path, onnx.ModelProto], data_path: Path,
                         min_bytes: int = 1024, align: int = 64) -> None:
    """Save several graphs whose large initializers live once in one shared external data file."""
    offsets: dict[str, tuple[int, int]] = {}
    with open(data_path, "wb") as data:
        for model in models.values():
            for t in _all_initializers(model.graph):
                raw = numpy_helper.to_array(t).tobytes()
                if len(raw) < min_bytes:
                    continue
                key = _tensor_key(t, raw)
                if key not in offsets:
                    data.write(b"\0" * (-data.tell() % align))
                    offsets[key] = (data.tell(), len(raw))
                    data.write(raw)
                _point_to_external(t, data_path.name, *offsets[key])
    for path, model in models.items():
        onnx.save(model, str(path))


def _all_initializers(graph: onnx.GraphProto):
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_initializers(attr.g)


def _point_to_external(t: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
        t.ClearField(field)
    del t.external_data[:]
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = t.external_data.add()
        entry.key, entry.value = k, v
    t.data_location = onnx.TensorProto.EXTERNAL


def save_inline(model: onnx.ModelProto, path: Path) -> None:
    """Save with all weights inside the .onnx file (under protobuf's 2 GB limit)."""
    onnx.save(model, str(path))


def as_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()

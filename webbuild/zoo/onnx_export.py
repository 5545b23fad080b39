"""torch -> ONNX through either torch.onnx path, and weight sharing between graphs.

Large models: graphs are exported to files (the exporters write weights > 2 GB as external data
themselves) and their weights are then streamed into one shared data file in bounded chunks, so no
graph's weights are ever held in memory as serialized copies.
"""

from __future__ import annotations

import hashlib
import inspect
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

EXPORTERS = ("torchscript", "dynamo")
OPSET = {"torchscript": 17, "dynamo": 18}
CHUNK = 64 << 20  # bytes read at a time when a tensor is copied between data files


def export_file(module, args: tuple, exporter: str, input_names: list[str], output_names: list[str],
                dynamic: dict[str, dict[int, str]], path: Path) -> Path:
    """Export `module(*args)` to `path`. Weights are inline below 2 GB, else external data files
    next to `path`, so give each export its own folder."""
    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}; choose one of {', '.join(EXPORTERS)}")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(module, args, str(path), dynamo=False, input_names=input_names,
                              output_names=output_names, dynamic_axes=dynamic,
                              opset_version=OPSET[exporter], do_constant_folding=True)
        else:
            torch.onnx.export(module, args, str(path), dynamo=True, input_names=input_names,
                              output_names=output_names,
                              dynamic_shapes=_dynamic_shapes(module, args, input_names, dynamic),
                              opset_version=OPSET[exporter], external_data=True, optimize=True, verbose=False)
    return path


def export_graph(module, args: tuple, exporter: str, input_names: list[str], output_names: list[str],
                 dynamic: dict[str, dict[int, str]]) -> onnx.ModelProto:
    """Export `module(*args)` and return the loaded ModelProto (weights in memory: small models only)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = export_file(module, args, exporter, input_names, output_names, dynamic, Path(tmp) / "model.onnx")
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


class SharedWeights:
    """One external data file that several graphs point into; equal tensors are stored once."""

    def __init__(self, data_path: Path, min_bytes: int = 1024, align: int = 64):
        self.path = Path(data_path)
        self.min_bytes = min_bytes
        self.align = align
        self.offsets: dict[str, tuple[int, int]] = {}
        self._data = open(self.path, "wb")  # noqa: SIM115 - written by add() calls, closed in __exit__

    def __enter__(self) -> SharedWeights:
        return self

    def __exit__(self, *exc) -> None:
        self._data.close()

    def add(self, model: onnx.ModelProto, base_dir: Path | None = None) -> None:
        """Point `model`'s large initializers into the shared file (in place). `base_dir` is where
        the external data files of a model loaded with `load_external_data=False` lie."""
        for t in _all_initializers(model.graph):
            if _byte_size(t, base_dir) < self.min_bytes:
                _make_inline(t, base_dir)
            else:
                _point_to_external(t, self.path.name, *self._store(t, base_dir))

    def add_file(self, src: Path, dst: Path) -> None:
        """Save graph file `src` (inline or with external data) as `dst` with its weights in here."""
        model = onnx.load(str(src), load_external_data=False)
        self.add(model, Path(src).parent)
        onnx.save(model, str(dst))

    def _store(self, t: onnx.TensorProto, base_dir: Path | None) -> tuple[int, int]:
        """Append `t`'s bytes while hashing them; drop them again if an equal tensor is stored."""
        self._data.write(b"\0" * (-self._data.tell() % self.align))
        start = self._data.tell()
        digest = hashlib.sha256()
        for chunk in _tensor_chunks(t, base_dir):
            digest.update(chunk)
            self._data.write(chunk)
        digest.update(str((t.data_type, tuple(t.dims))).encode())
        key = digest.hexdigest()
        if key in self.offsets:
            self._data.truncate(start)
            self._data.seek(start)
        else:
            self.offsets[key] = (start, self._data.tell() - start)
        return self.offsets[key]


def save_sharing_weights(models: dict[Path, onnx.ModelProto], data_path: Path,
                         min_bytes: int = 1024, align: int = 64) -> None:
    """Save several in-memory graphs whose large initializers live once in one shared data file."""
    with SharedWeights(data_path, min_bytes, align) as shared:
        for model in models.values():
            shared.add(model)
    for path, model in models.items():
        onnx.save(model, str(path))


def save_inline_file(src: Path, dst: Path) -> None:
    """`src` as one self-contained .onnx file `dst` (moved as is when it has no external data)."""
    model = onnx.load(str(src), load_external_data=False)
    if not any(_is_external(t) for t in _all_initializers(model.graph)):
        shutil.move(str(src), str(dst))
        return
    onnx.load_external_data_for_model(model, str(Path(src).parent))
    onnx.save(model, str(dst))  # raises if the weights exceed protobuf's 2 GB


def _all_initializers(graph: onnx.GraphProto):
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_initializers(attr.g)


def _is_external(t: onnx.TensorProto) -> bool:
    return t.data_location == onnx.TensorProto.EXTERNAL


def _external_info(t: onnx.TensorProto, base_dir: Path | None) -> tuple[Path, int, int | None]:
    info = {e.key: e.value for e in t.external_data}
    if base_dir is None:
        raise ValueError(f"initializer {t.name!r} has external data but no folder to read it from was given")
    length = int(info["length"]) if "length" in info else None
    return Path(base_dir) / info["location"], int(info.get("offset", 0)), length


def _byte_size(t: onnx.TensorProto, base_dir: Path | None) -> int:
    if not _is_external(t):
        return len(t.raw_data) if t.HasField("raw_data") else numpy_helper.to_array(t).nbytes
    path, offset, length = _external_info(t, base_dir)
    return length if length is not None else path.stat().st_size - offset


def _tensor_chunks(t: onnx.TensorProto, base_dir: Path | None) -> Iterator[bytes]:
    """The tensor's little-endian bytes, at most CHUNK at a time for external data."""
    if not _is_external(t):
        yield t.raw_data if t.HasField("raw_data") else numpy_helper.to_array(t).tobytes()
        return
    path, offset, length = _external_info(t, base_dir)
    left = length if length is not None else path.stat().st_size - offset
    with open(path, "rb") as f:
        f.seek(offset)
        while left > 0:
            chunk = f.read(min(CHUNK, left))
            if not chunk:
                raise ValueError(f"{path}: ends before initializer {t.name!r} does")
            left -= len(chunk)
            yield chunk


def _make_inline(t: onnx.TensorProto, base_dir: Path | None) -> None:
    if _is_external(t):
        raw = b"".join(_tensor_chunks(t, base_dir))
        del t.external_data[:]
        t.data_location = onnx.TensorProto.DEFAULT
        t.raw_data = raw


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

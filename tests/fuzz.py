"""The fuzz harness: random corruptions of every kind of input the commands read, as hypothesis strategies,
and one case's run with the checks every outcome must pass (tests/test_fuzz.py runs a fixed-seed budget,
`make fuzz` a larger one).

A case copies the embedded example's inputs into a folder of its own, corrupts one file, runs one command that
reads that file in this process (click's CliRunner) and checks: exit 0, or exit 2 with one `error:` line (an
invalid model.yaml: one per problem) and no traceback; no partial output (a failed command leaves no output
folder and nothing beside it); each error line names a file or folder of the case's inputs and no staging
folder.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import onnx
import yaml
from hypothesis import strategies as st

from tests.example_config import EXAMPLE
from tests.inputs import Outcome, invoke, link_tree, replace

SOURCE_FILES = ("config.json", "tokenizer.json", "embed_tokens.bin", "encoder.onnx", "decoder_init.onnx",
                "decoder_step.onnx", "decoder_weights.data", "preprocessor_config.json")
GRAPHS = ("encoder.onnx", "decoder_init.onnx", "decoder_step.onnx")
BYTE_EDITS = ("truncate", "flip", "zero", "shuffle", "empty", "garbage")
GRAPH_EDITS = ("rename input", "rename output", "drop output", "add output", "input dtype", "input rank",
               "input width")
YAML_KEYS = ("name", "source", "source.layout", "source.dir", "site", "site.samples", "site.base_path",
             "site.title", "quantize", "quantize.bits", "quantize.method", "encoder.lead_ms", "variants", "output",
             "shard.max_bytes", "verify.max_wer", "fusion.enabled", "adapters")


@dataclass(frozen=True)
class Case:
    kind: str  # model.yaml, source, wav, adapter, site
    target: str  # the file corrupted, relative to the case's folder
    edit: str
    seed: int  # positions and values of the edit
    command: str  # build, fuse, transcribe


def cases() -> st.SearchStrategy[Case]:
    seeds = st.integers(0, 2**32 - 1)
    yaml_case = st.builds(Case, st.just("model.yaml"), st.just("model.yaml"),
                          st.sampled_from([*BYTE_EDITS, *(f"field {k}" for k in YAML_KEYS)]), seeds, st.just("build"))
    source = st.builds(Case, st.just("source"), st.sampled_from([f"model/{f}" for f in SOURCE_FILES]),
                       st.sampled_from(BYTE_EDITS), seeds, st.sampled_from(["fuse", "transcribe"]))
    graph = st.builds(Case, st.just("source"), st.sampled_from([f"model/{g}" for g in GRAPHS]),
                      st.sampled_from(GRAPH_EDITS), seeds, st.sampled_from(["fuse", "transcribe", "build"]))
    wav = st.builds(Case, st.just("wav"), st.just("sample.wav"), st.sampled_from([*BYTE_EDITS, "header"]), seeds,
                    st.just("transcribe"))
    adapter = st.builds(Case, st.just("adapter"),
                        st.sampled_from(["klatt/adapter_config.json", "klatt/adapter_model.safetensors"]),
                        st.sampled_from(["truncate", "empty", "garbage", "header", "json field"]), seeds,
                        st.just("build"))
    site = st.builds(Case, st.just("site"), st.sampled_from(["dist/model/manifest.json", "dist/model/shards/*"]),
                     st.sampled_from([*BYTE_EDITS, "json field"]), seeds, st.just("transcribe"))
    return st.one_of(yaml_case, source, graph, wav, adapter, site)


# ---------------------------------------------------------------- the edits


def edit_bytes(data: bytes, edit: str, rng: random.Random, region: int | None = None) -> bytes:
    """`data` with one corruption; `region`: only its first bytes are touched (a header)."""
    n = len(data)
    span = min(n, region or n)
    at = rng.randrange(span) if span else 0
    if edit == "truncate":
        return data[:rng.randrange(n)] if n else data
    if edit in ("flip", "header"):
        out = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            if span:
                out[rng.randrange(span)] ^= 1 << rng.randrange(8)
        return bytes(out)
    if edit == "zero":
        length = rng.randint(1, max(1, n // 8))
        return data[:at] + bytes(min(length, n - at)) + data[at + length:]
    if edit == "shuffle":
        chunk = max(1, n // 16)
        parts = [data[i:i + chunk] for i in range(0, n, chunk)]
        rng.shuffle(parts)
        return b"".join(parts)
    if edit == "empty":
        return b""
    if edit == "garbage":
        return rng.randbytes(rng.choice([1, 7, 100, max(1, n)]))
    raise AssertionError(edit)


def random_value(rng: random.Random):
    return rng.choice([None, -1, 0, 3, 10**12, 1.5, float("nan"), "", "x", "../../etc", "é" * 3, [], [1, "a"],
                       {}, {"a": 1}, True])


def edit_field(data: dict, key: str, rng: random.Random) -> dict:
    """`data` with the value at dotted `key` replaced by a random one, or removed."""
    *parents, last = key.split(".")
    node = data
    for p in parents:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    if rng.random() < 0.2:
        node.pop(last, None)
    else:
        node[last] = random_value(rng)
    return data


def edit_graph(path: Path, edit: str, rng: random.Random) -> None:
    model = onnx.load(path, load_external_data=False)
    g = model.graph
    value = rng.choice(list(g.input if "input" in edit else g.output))
    if edit.startswith("rename"):
        old, new = value.name, value.name + rng.choice(["_", "2", "X"])
        value.name = new
        for node in g.node:
            node.input[:] = [new if i == old else i for i in node.input]
            node.output[:] = [new if o == old else o for o in node.output]
    elif edit == "drop output":
        g.output.remove(value)
    elif edit == "add output":
        g.output.append(onnx.helper.make_tensor_value_info(rng.choice(list(g.node)).output[0],
                                                           onnx.TensorProto.FLOAT, None))
    elif edit == "input dtype":
        value.type.tensor_type.elem_type = rng.choice([onnx.TensorProto.FLOAT16, onnx.TensorProto.INT32,
                                                       onnx.TensorProto.DOUBLE, onnx.TensorProto.INT64])
    elif edit == "input rank":
        value.type.tensor_type.shape.dim.add().dim_value = 1
    elif edit == "input width" and value.type.tensor_type.shape.dim:
        value.type.tensor_type.shape.dim[-1].dim_value = rng.choice([1, 7, 255, 4096])
    replace(path, model.SerializeToString())


def corrupt(case: Case, root: Path) -> Path:
    """Apply the case's edit under `root`; the file it changed."""
    rng = random.Random(case.seed)
    path = root / case.target
    if "*" in case.target:
        path = rng.choice(sorted(path.parent.iterdir()))
    if case.edit in GRAPH_EDITS:
        edit_graph(path, case.edit, rng)
    elif case.edit.startswith("field "):
        data = yaml.safe_load(path.read_text())
        replace(path, yaml.safe_dump(edit_field(data, case.edit.removeprefix("field "), rng)).encode())
    elif case.edit == "json field" and path.suffix == ".json":
        data = json.loads(path.read_text())
        keys = sorted(data) or ["x"]
        data[rng.choice(keys)] = random_value(rng)
        replace(path, json.dumps(data).encode())
    else:  # "json field" of a file that is not JSON (a shard): a flip
        region = 300 if case.edit == "header" else None
        edit = "flip" if case.edit == "json field" else case.edit
        replace(path, edit_bytes(path.read_bytes(), edit, rng, region))
    return path


# ---------------------------------------------------------------- one case


def inputs(root: Path, case: Case, site: Path | None) -> None:
    """The case's own copy of what its command reads."""
    link_tree(EXAMPLE / "model", root / "model")
    shutil.copy2(EXAMPLE / "samples" / "sample-1.wav", root / "sample.wav")
    adapters = ""
    if case.kind == "adapter":
        link_tree(EXAMPLE / "adapters" / "klatt", root / "klatt")
        adapters = "adapters:\n  - {name: klatt, path: ./klatt}\n"
    if case.kind == "site":
        link_tree(site, root / "dist")
    (root / "model.yaml").write_text(
        "name: fuzz\nsource: {layout: qwen3-asr-split, dir: ./model}\nvariants: [fp32]\n"
        "site:\n  samples:\n    - {audio: sample.wav, text: harmony emerge surprise}\n" + adapters)


def command(case: Case, root: Path) -> list:
    out = root / "out"
    if case.command == "build":
        return [root / "model.yaml", "-o", out]
    if case.command == "fuse":
        return ["fuse", root / "model", "-o", out]
    model = root / "dist" if case.kind == "site" else root / "model"
    return ["transcribe", model, root / "sample.wav", "--max-new-tokens", "8"]


def run_case(case: Case, site: Path, tally: Counter) -> None:
    """One case, checked; `tally` counts the outcomes by kind."""
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        root = Path(tmp)
        inputs(root, case, site)
        corrupt(case, root)
        start = time.monotonic()
        outcome = invoke(*command(case, root))
        check(outcome, case, root)
        tally[(case.kind, case.command, "ok" if outcome.code == 0 else "error")] += 1
        if os.environ.get("WEBBUILD_FUZZ_TRACE"):
            print(f"{time.monotonic() - start:5.1f}s {outcome.code} {case}", file=sys.__stderr__)


def check(outcome: Outcome, case: Case, root: Path) -> None:
    lines = outcome.ok_or_error_lines()  # exit 0, or exit 2 with its error line(s): no traceback
    out = root / "out"
    staged = [p.name for p in root.iterdir() if p.name.startswith(".")]
    assert not staged, (case, staged)  # no staging folder or lock file left beside the output
    if not lines:
        if case.command != "transcribe":
            assert (out / ("build-report.json" if case.command == "build" else "decoder.onnx")).is_file(), case
        return
    assert not out.exists(), (case, lines)  # nothing half-written
    for line in lines:  # each names the user's file, never a staging path
        assert str(root) in line and "-build-" not in line, (case, line)

"""A copy of a built site whose adapted step graphs (decoder.*.lora.step.onnx) run other forms of the LoRA branch,
one adapter's values baked in as constants: a probe of the branch's forms in the browser without changing the
runtime (BENCHMARKS.md, "In Chromium": where the adapter's time goes). The page still feeds the step its lora.*
inputs; those the probe's nodes no longer read stay as unused inputs.

  --ups         each up of the step (and the Add of the base output after it) as one 8-bit MatMulNBits whose
                bias is the base output (gate's and up's: their bias, as before), the up's codes from the adapter
  --packed-qkv  q, k and v of each layer as one packed 4-bit MatMulNBits (its weights a Concat of theirs, for
                onnxruntime to fold at session creation) whose bias is the three updates at once (one up MatMul
                against the ups side by side, baked in as float32), into GroupQueryAttention's packed input; the
                shared down reads the layer's norm itself (no copy of it: nothing is left to fuse); onnxruntime-web
                1.30 refuses packed QKV with Q/K norms inside GroupQueryAttention (Qwen3's), so a Split of the
                packed output feeds its three inputs (--packed-qkv split) unless told `gqa`

The site's manifest gets the new files (sha256 and size) and a new version; the shards are hard links.
On the GPU machine, after `chrome_gpu_bench.sh gen` with LORA=1:
  python3 scripts/lora_step_probe.py /tmp/cgbl/webbuild /tmp/cgbq/webbuild rand --ups
then `WORK=/tmp/cgbq STEPS=lora_rounds ... chrome_gpu_bench.sh run` after `printf 'gen done\\n' > /tmp/cgbq/gen.log`.
Only int8 adapter files (their codes are used as they are) and fp32 variants (the others are left as built).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from webbuild.site.adapter_pack import BLOCK, ZERO_POINT, unpack
from webbuild.site.manifest import version_hash


class Site:
    """A built site's manifest and files, read from `root`."""

    def __init__(self, root: Path):
        self.root = root
        self.manifest = json.loads((root / "model" / "manifest.json").read_text())

    def file(self, name: str) -> bytes:
        parts = self.manifest["files"][name]["parts"]
        return b"".join((self.root / "model" / p["shard"]).read_bytes()[p["offset"]:p["offset"] + p["length"]]
                        for p in parts)


def up_codes(site: Site, adapter: str, name: str) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(codes [N, blocks, 32], scales [N, blocks], K, N) of an int8 file's input, its unstored rows zeros."""
    entry = site.manifest["adapters"][adapter]
    if entry["precision"] != "int8":
        raise SystemExit(f"adapter {adapter}: precision {entry['precision']}; the probe reads int8 files")
    data, t = site.file(entry["file"]), entry["tensors"][name]
    k, n = t["shape"]
    start, stop = t.get("rows", (0, k))
    stored, blocks = -(-(stop - start) // BLOCK), -(-k // BLOCK)
    assert start % BLOCK == 0, "an up's rows start on a block"
    codes = np.full((n, blocks, BLOCK), ZERO_POINT, np.uint8)
    scales = np.zeros((n, blocks), np.float32)
    at = start // BLOCK
    codes[:, at:at + stored] = np.frombuffer(data, np.uint8, n * stored * BLOCK, t["offset"]).reshape(n, stored, BLOCK)
    scales[:, at:at + stored] = np.frombuffer(data, np.float32, n * stored, t["scales_offset"]).reshape(n, stored)
    return codes, scales, k, n


def nbits(inputs: list[str], output: str, name: str, k: int, n: int) -> onnx.NodeProto:
    return helper.make_node("MatMulNBits", inputs, [output], name=name, domain="com.microsoft", K=k, N=n, bits=8,
                            block_size=BLOCK, accuracy_level=0)


def ups_as_int8(model: onnx.ModelProto, site: Site, adapter: str) -> int:
    """Each `lora/{i}/{proj}/delta` MatMul (and its `out2` Add) as an 8-bit MatMulNBits; how many changed."""
    graph = model.graph
    by_name = {n.name: n for n in graph.node}
    replaced: dict[str, list[onnx.NodeProto]] = {}
    dropped: set[str] = set()
    for node in graph.node:
        parts = node.name.split("/")
        if not (len(parts) == 4 and parts[0] == "lora" and parts[3] == "delta"):
            continue
        prefix = "/".join(parts[:3])
        codes, scales, k, n = up_codes(site, adapter, f"lora.{parts[1]}.{parts[2]}.up")
        graph.initializer.extend([numpy_helper.from_array(codes, f"{prefix}/up_codes"),
                                  numpy_helper.from_array(scales, f"{prefix}/up_scales")])
        operands = [node.input[0], f"{prefix}/up_codes", f"{prefix}/up_scales"]
        add = by_name.get(f"{prefix}/out2")
        if add is None:  # gate's and up's: the update goes on into their bias
            replaced[node.name] = [nbits(operands, node.output[0], f"{prefix}/up8", k, n)]
            continue
        graph.initializer.append(numpy_helper.from_array(np.array([n], np.int64), f"{prefix}/width"))
        flat = helper.make_node("Reshape", [add.input[1], f"{prefix}/width"], [f"{prefix}/y1"], name=f"{prefix}/y1")
        replaced[node.name] = [flat, nbits([*operands, "", "", f"{prefix}/y1"], add.output[0], f"{prefix}/up8", k, n)]
        dropped.add(add.name)
    nodes = [new for node in graph.node for new in replaced.get(node.name, [node]) if new.name not in dropped]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(replaced)


def up_values(site: Site, adapter: str) -> dict[str, np.ndarray]:
    """{graph input: float32 [K, N]} of an adapter file, as the page feeds them."""
    entry = site.manifest["adapters"][adapter]
    return unpack(site.file(entry["file"]), entry["tensors"], entry["precision"])


def packed_qkv(model: onnx.ModelProto, site: Site, adapter: str, mode: str, ups: bool) -> int:
    """Each layer's q, k, v MatMulNBits and their updates as one packed MatMulNBits with the updates as its bias,
    read by GroupQueryAttention as packed QKV; how many layers changed."""
    graph, values = model.graph, up_values(site, adapter)
    by_out = {o: n for n in graph.node for o in n.output}
    by_name = {n.name: n for n in graph.node}
    new: dict[str, list[onnx.NodeProto]] = {}
    dropped: set[str] = set()
    layers = 0
    for gqa in [n for n in graph.node if n.op_type == "GroupQueryAttention"]:
        parts = gqa.input[0].split("/")
        if len(parts) != 4 or parts[0] != "lora":
            continue
        layer = parts[1]
        adds = [by_name[f"lora/{layer}/{p}/out2"] for p in ("q_proj", "k_proj", "v_proj")]
        projs = [by_out[by_out[add.input[1]].input[0]] for add in adds]  # Add(delta, Reshape(projection))
        attrs = {a.name: helper.get_attribute_value(a) for a in projs[0].attribute}
        widths = [next(helper.get_attribute_value(a) for a in p.attribute if a.name == "N") for p in projs]
        assert all(len(p.input) == 3 for p in projs), "the probe packs projections without zero points or bias"
        pre = f"lora/{layer}/qkv_packed"
        cat_w = helper.make_node("Concat", [p.input[1] for p in projs], [f"{pre}/B"], name=f"{pre}/B", axis=0)
        cat_s = helper.make_node("Concat", [p.input[2] for p in projs], [f"{pre}/S"], name=f"{pre}/S", axis=0)
        graph.initializer.append(numpy_helper.from_array(np.array([sum(widths)], np.int64), f"{pre}/width"))
        low, names = f"lora/{layer}/qkv_proj/low8", [f"lora.{layer}.{p}.up" for p in ("q_proj", "k_proj", "v_proj")]
        if ups:  # the three ups' codes back to back: rows of one [sum(widths), blocks, 32]
            parts = [up_codes(site, adapter, n) for n in names]
            codes, scales = (np.concatenate([part[i] for part in parts]) for i in (0, 1))
            graph.initializer.extend([numpy_helper.from_array(codes, f"{pre}/up_codes"),
                                      numpy_helper.from_array(scales, f"{pre}/up_scales")])
            delta = nbits([low, f"{pre}/up_codes", f"{pre}/up_scales"], f"{pre}/delta", f"{pre}/up8", parts[0][2],
                          sum(widths))
        else:
            up = np.concatenate([values[n] for n in names], axis=1)
            graph.initializer.append(numpy_helper.from_array(up, f"{pre}/up"))
            delta = helper.make_node("MatMul", [low, f"{pre}/up"], [f"{pre}/delta"], name=f"{pre}/up")
        bias = helper.make_node("Reshape", [f"{pre}/delta", f"{pre}/width"], [f"{pre}/bias"], name=f"{pre}/bias")
        packed = helper.make_node("MatMulNBits", [projs[0].input[0], f"{pre}/B", f"{pre}/S", "", "", f"{pre}/bias"],
                                  [f"{pre}/out"], name=pre, domain="com.microsoft",
                                  **{**attrs, "N": sum(widths)})
        new[projs[0].name] = [cat_w, cat_s, delta, bias, packed]
        if mode == "split":
            graph.initializer.append(numpy_helper.from_array(np.array(widths, np.int64), f"{pre}/widths"))
            outs = [f"{pre}/{p}" for p in ("q", "k", "v")]
            new[projs[0].name].append(helper.make_node("Split", [f"{pre}/out", f"{pre}/widths"], outs,
                                                       name=f"{pre}/split", axis=-1))
            gqa.input[0], gqa.input[1], gqa.input[2] = outs
        else:
            gqa.input[0], gqa.input[1], gqa.input[2] = f"{pre}/out", "", ""
        x2 = by_name[f"lora/{layer}/qkv_proj/x2"]
        copy = by_out[x2.input[0]]
        x2.input[0] = projs[0].input[0]  # the down reads the layer's norm
        dropped.add(copy.name)
        for p in ("q_proj", "k_proj", "v_proj"):
            dropped.update(f"lora/{layer}/{p}/{part}" for part in ("y2", "delta", "out2", "out"))
        dropped.update(p.name for p in projs[1:])
        layers += 1
    nodes = [n for node in graph.node for n in new.get(node.name, [node]) if n.name not in dropped]
    del graph.node[:]
    graph.node.extend(nodes)
    return layers


def probe_site(src: Path, dest: Path, adapter: str, ups: bool, packed: str | None = None) -> None:
    site = Site(src)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, copy_function=os.link)
    manifest = site.manifest
    for variant in manifest["variants"].values():
        step = variant.get("decoder_lora_step")
        if not step or variant["dtype"] != "float32":  # the probe's scales are float32, MatMulNBits' the graph's
            continue
        model = onnx.load_from_string(site.file(step))
        changed = packed_qkv(model, site, adapter, packed, ups) if packed else 0
        changed += ups_as_int8(model, site, adapter) if ups else 0
        blob = model.SerializeToString()
        shard, digest = f"shards/{step}.probe.bin", hashlib.sha256(blob).hexdigest()
        (dest / "model" / shard).write_bytes(blob)
        manifest["files"][step] = {"size": len(blob), "sha256": digest,
                                   "parts": [{"shard": shard, "offset": 0, "length": len(blob)}]}
        manifest["shards"].append({"path": shard, "size": len(blob), "sha256": digest})
        print(f"{step}: {changed} nodes replaced")
    manifest["version"] = version_hash(manifest)
    (dest / "model" / "manifest.json").unlink()  # a hard link to the source's
    (dest / "model" / "manifest.json").write_text(json.dumps(manifest))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path, help="a built site with adapters (webbuild's output folder)")
    ap.add_argument("dest", type=Path, help="the probe's copy (replaced)")
    ap.add_argument("adapter", help="the adapter whose values are baked in")
    ap.add_argument("--ups", action="store_true", help="the ups as 8-bit MatMulNBits with the base output as bias")
    ap.add_argument("--packed-qkv", nargs="?", const="split", choices=("split", "gqa"),
                    help="q, k, v and their updates as one packed MatMulNBits (split: a Split after; gqa: packed in)")
    args = ap.parse_args()
    probe_site(args.src, args.dest, args.adapter, args.ups, args.packed_qkv)


if __name__ == "__main__":
    main()

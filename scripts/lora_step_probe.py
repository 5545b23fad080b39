"""A copy of a built site whose adapted step graphs (decoder.*.lora.step.onnx) run other forms of the LoRA branch,
one adapter's values baked in as constants: a probe of the branch's forms in the browser without changing the
runtime (docs/benchmarks-archive-2026-12.md, "In Chromium": where the adapter's time goes). The page still feeds
the step its lora.* inputs; those the probe's nodes no longer read stay as unused inputs.

  --ups   each up of the step (and the Add of the base output after it) as one 8-bit MatMulNBits whose bias
          is the base output (gate's and up's: their bias, as before; the packed q/k/v's: the packed output), the
          up's codes from the adapter file (a packed up's: its members' codes back to back)

(The packed q/k/v form was first probed here, as `--packed-qkv`, at 8751352; it is now the step form's own,
webbuild.forms.lora.packed_updates.)

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

from webbuild.adapters import DOWN_GROUPS
from webbuild.site.adapter_pack import BLOCK, ZERO_POINT
from webbuild.site.contract import IO, PACKED_UPS
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
    """(codes [N, blocks, 32], scales [N, blocks], K, N) of an int8 file's input, its unstored rows zeros; a packed
    group's up (contract.PACKED_UPS) is its members' rows back to back."""
    layer, owner, _ = IO.lora_parts(name) or (0, "", "")
    if owner in PACKED_UPS:
        parts = [up_codes(site, adapter, IO.lora_input(layer, proj, "up")) for proj in DOWN_GROUPS[owner]]
        return (np.concatenate([c for c, *_ in parts]), np.concatenate([s for _, s, *_ in parts]), parts[0][2],
                sum(n for *_, n in parts))
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


def probe_site(src: Path, dest: Path, adapter: str, ups: bool) -> None:
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
        changed = ups_as_int8(model, site, adapter) if ups else 0
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
    args = ap.parse_args()
    probe_site(args.src, args.dest, args.adapter, args.ups)


if __name__ == "__main__":
    main()

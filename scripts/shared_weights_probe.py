"""Probe (removed after its run, BENCHMARKS.md "One copy of the decoder's weights"): reassembles a built site's
fp32 decoder, step graph, weights and runtime.json into OUT, and writes a copy of each graph whose initializers
stored in the weights file are graph inputs (`*.ws.onnx`, with the weights' table `*.ws.onnx.json`).

    .venv/bin/python scripts/shared_weights_probe.py /tmp/exd5 /tmp/ws
    node --liftoff-only scripts/shared_weights_probe.mjs       # prefill: kernels and logits, both forms
    node --liftoff-only scripts/shared_weights_steps.mjs       # captured steps: tokens, both forms
(the node lines with LD_LIBRARY_PATH=/usr/lib/chromium VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json)
"""

import json
import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from webbuild.site.manifest import reassemble


def main(site: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((site / "model" / "manifest.json").read_text())
    variant = manifest["variants"]["fp32"]
    for name in (variant["decoder"], variant["decoder_data"], variant["decoder_step"], "runtime.json"):
        reassemble(site / "model", manifest, name, out / name)
    for graph in (variant["decoder"], variant["decoder_step"]):
        model = onnx.load(out / graph, load_external_data=False)
        kept, moved = [], []
        for init in model.graph.initializer:
            if init.data_location != TensorProto.EXTERNAL:
                kept.append(init)
                continue
            ext = {e.key: e.value for e in init.external_data}
            moved.append({"name": init.name, "dtype": init.data_type, "dims": list(init.dims),
                          "offset": int(ext.get("offset", 0)), "length": int(ext["length"])})
            model.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept)
        target = out / graph.replace(".onnx", ".ws.onnx")
        onnx.save(model, target)
        (out / f"{target.name}.json").write_text(json.dumps(moved))
        print(f"{target}: {len(moved)} weights as inputs, {len(kept)} initializers kept")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

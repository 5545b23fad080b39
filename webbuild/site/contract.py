"""The names the built site's browser runtime (webbuild/template) and the Python side agree on.

The build writes `runtime_names()` into runtime.json, so the JS reads the file roles and the
onnxruntime-web names from there instead of repeating them. The JS knows two names before it can
read runtime.json: `RUNTIME_FILE` and `SAMPLES_FILE`, in webbuild/template/runtime/contract.js (a
test keeps them equal to these), and `LORA_PICKER`, the page element `webbuild verify` drives.
"""

from __future__ import annotations

RUNTIME_FILE = "runtime.json"  # a logical file of the model manifest: the constants the runtime needs
TOKENS_FILE = "tokens.bin"  # the decode table (webbuild.pipeline.assemble.token_table)
SAMPLES_FILE = "samples.json"  # beside index.html: the sample clips, their texts and verify's WER bound
# the id of the page's LoRA adapter picker (a <select>: each adapter's name, '' for the base model), which
# `webbuild verify` drives; window.webbuild.lora is the adapter on (null: the base model)
LORA_PICKER = "lora"

# onnxruntime-web's webgpu build (native WebGPU EP, wasm EP included) and the wasm glue it imports,
# copied into the site's ORT_DIR. Its wasm binary (25.5 MiB) goes through the shard manifest instead.
ORT_DIR = "ort"
ORT_MODULE = "ort.webgpu.min.mjs"
ORT_MODULES = (ORT_MODULE, "ort-wasm-simd-threaded.asyncify.mjs")
ORT_WASM = "ort-wasm-simd-threaded.asyncify.wasm"

# A manifest variant entry names its files by role ({"encoder": "encoder.fp16.onnx", "decoder_data": ...});
# the runtime finds each graph's files through this table: the graph, its external weights, its wasm
# twin (webbuild.quantize.wasm_twin), the decoder's step form for graph capture (webbuild.pipeline.step_form)
# and, for decoders that take inputs_embeds, the embedding table. A build with LoRA adapters adds the
# adapted decoder (webbuild.pipeline.lora_form, docs/adapters.md) with the same kinds of forms, reading the
# base decoder's weights file; the runtime loads it beside the base one (runtime/lora.js).
# An fp32 entry also carries `wasm`: {need_bytes, budget_bytes, fits} (webbuild.pipeline.wasm_budget); where
# fits is false (no form of the graphs fits) the runtime (runtime/site.js refuseUnfit) says the model needs
# WebGPU instead of loading.
FILE_ROLES = {
    "encoder": {"graph": "encoder", "data": "encoder_data", "wasm": "encoder_wasm"},
    "decoder": {"graph": "decoder", "data": "decoder_data", "wasm": "decoder_wasm", "step": "decoder_step",
                "embed": "embed"},
    "decoder_lora": {"graph": "decoder_lora", "data": "decoder_data", "wasm": "decoder_lora_wasm",
                     "step": "decoder_lora_step"},
}


def runtime_names() -> dict:
    """runtime.json's keys for the names above (webbuild.pipeline.assemble.runtime_config)."""
    return {"files": {"tokens": TOKENS_FILE, "ort_module": f"{ORT_DIR}/{ORT_MODULE}", "ort_wasm": ORT_WASM},
            "roles": FILE_ROLES}

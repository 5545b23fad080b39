"""The names the built site's browser runtime (webbuild/template) and the Python side agree on.

The build writes `runtime_names()` into runtime.json, so the JS reads the file roles, the graphs' input
and output names (`IO`), the precision variants' policy (`VARIANTS`) and the onnxruntime-web names from
there instead of repeating them; every Python producer or reader of a graph name takes it from `IO`.
The JS knows two names before it can read runtime.json: `RUNTIME_FILE` and `SAMPLES_FILE`, in
webbuild/template/runtime/contract.js (a test keeps them equal to these), and `LORA_PICKER`, the page
element `webbuild verify` drives.
"""

from __future__ import annotations

import re

from webbuild.adapters import DOWN_GROUPS

RUNTIME_FILE = "runtime.json"  # a logical file of the model manifest: the constants the runtime needs
TOKENS_FILE = "tokens.bin"  # the decode table (webbuild.pipeline.assemble.token_table)
SAMPLES_FILE = "samples.json"  # beside index.html: the sample clips, their texts and verify's WER bound
# beside index.html (model.yaml site.isolation_worker): the service worker that adds the COOP/COEP headers where the
# host sends none; index.html names it for app/isolation.js
ISOLATION_WORKER = "isolation-sw.js"
# the id of the page's LoRA adapter picker (a <select>: each adapter's name, '' for the base model), which
# `webbuild verify` drives; window.webbuild.lora is the adapter on (null: the base model)
LORA_PICKER = "lora"
# the id of the page's language picker (a <select>: '' for automatic, else one of runtime.json's prompt.languages),
# which `webbuild verify` drives; window.webbuild.language is the language the last answer named
LANGUAGE_PICKER = "language"
# the id of the page's context field (an <input>: text for the prompt's system message, runtime/bpe.js), which
# `webbuild verify` fills; disabled where the page cannot tokenise text for the model (runtime.json prompt.context)
CONTEXT_FIELD = "context"
# The adapted step form's lora inputs, by the graph passes that make them (webbuild.forms.lora); each pass
# gives each input it makes a layout record, which the manifest variant's `lora_layout` carries to the page
# (lora.step_layout, docs/adapters.md). The names and choices below are the build's alone.
# the step form's down factors (webbuild.forms.lora.quantized_downs): a group's down in MatMulNBits' 8-bit
# layout, codes and scales (a FUSED_DOWNS group's 4-bit: adapter_pack.down_bits)
DOWN_CODES, DOWN_SCALES = "down_codes", "down_scales"
# the groups whose down rides in a norm's fused kernel in the adapted step form (lora.spare_readers): 4-bit
# codes, the only kind that kernel reads
FUSED_DOWNS = ("qkv_proj", "gate_up_proj")
DOWN_BITS = {group: 4 if group in FUSED_DOWNS else 8 for group in DOWN_GROUPS}
# the groups whose down the adapted step form joins to its projection's weights (lora.joint_downs): one 4-bit
# MatMulNBits of `lora.{i}.{group}.joint_codes` / `.joint_scales` (the base projection's rows, which the page copies
# from the decoder's weights file at load, then the down's) gives the projection's output and the down's side by
# side, and one 8-bit MatMulNBits of `lora.{i}.{proj}.up_codes` / `.up_scales` (an identity over the first, the up
# over the second) adds the update. Their layout records' `base` says where each base part lies.
JOINT_DOWNS = ("o_proj", "down_proj")
JOINT_CODES, JOINT_SCALES, UP_CODES, UP_SCALES = "joint_codes", "joint_scales", "up_codes", "up_scales"
# the groups whose projections the adapted step form packs into one MatMulNBits (lora.packed_updates): their
# ups are one input, `lora.{i}.{group}.up`, the members' ups side by side in DOWN_GROUPS order, and their down is
# 4-bit (FUSED_DOWNS)
PACKED_UPS = ("qkv_proj",)
# the groups whose updates the adapted step form reads merged (lora.merged_deltas): each member's update
# down @ up as one 4-bit MatMulNBits of `lora.{i}.{proj}.delta_codes` / `.delta_scales`, riding in the fused kernel of
# the group's norm copy. The page makes them at a switch with the delta graph (role `decoder_lora_delta`,
# webbuild.forms.lora_delta), which reads the adapted graph's `lora.{i}.{group}.down` and `lora.{i}.{proj}.up`
DELTA_GROUPS = ("gate_up_proj",)
DELTA_CODES, DELTA_SCALES = "delta_codes", "delta_scales"
DELTA_BITS = 4
# the page's live-transcription button (webbuild verify presses it) and the query parameter that makes the page
# keep the frames it captured (window.webbuild.live.audio()), as runtime/contract.js has them
LIVE_BUTTON = "live"
KEEP_AUDIO = "keep_audio"
# the page <-> worker messages of live transcription (runtime/contract.js documents each)
LIVE_TO_WORKER = {"liveStart": "live-start", "liveAudio": "live-audio", "liveStop": "live-stop"}
LIVE_FROM_WORKER = {"liveUpdate": "live-update", "liveDone": "live-done"}

# onnxruntime-web's webgpu build (native WebGPU EP, wasm EP included) and the wasm glue it imports,
# copied into the site's ORT_DIR. Its wasm binary (25.5 MiB) goes through the shard manifest instead.
ORT_DIR = "ort"
ORT_MODULE = "ort.webgpu.min.mjs"
ORT_MODULES = (ORT_MODULE, "ort-wasm-simd-threaded.asyncify.mjs")
ORT_WASM = "ort-wasm-simd-threaded.asyncify.wasm"

# A manifest variant entry names its files by role ({"encoder": "encoder.fp16.onnx", "decoder_data": ...});
# the runtime finds each graph's files through this table: the graph, its external weights, its wasm
# twin (webbuild.forms.wasm_twin) and, for an int8 twin, the plan of the uint8 weights the runtime derives
# from the int4 ones at load (runtime/int8.js), the decoder's step form for graph capture (webbuild.forms.step)
# and, for decoders that take inputs_embeds, the embedding table. A build with LoRA adapters adds the
# adapted decoder (webbuild.forms.lora, docs/adapters.md) with the same kinds of forms, reading the
# base decoder's weights file; the runtime loads it beside the base one (runtime/lora.js), and on WebGPU the
# delta graph (DELTA_GROUPS) that makes its step form's merged updates at a switch.
# An fp32 entry also carries `wasm`: {need_bytes, budget_bytes, fits, tab_bytes} (webbuild.pipeline.wasm_budget); where
# fits is false (no form of the graphs fits) the runtime (runtime/site.js refuseUnfit) says the model needs
# WebGPU instead of loading.
FILE_ROLES = {
    "encoder": {"graph": "encoder", "data": "encoder_data", "wasm": "encoder_wasm", "int8": "encoder_wasm_int8"},
    "decoder": {"graph": "decoder", "data": "decoder_data", "wasm": "decoder_wasm", "int8": "decoder_wasm_int8",
                "step": "decoder_step", "embed": "embed", "shared": "decoder_shared",
                "step_shared": "decoder_step_shared"},
    "decoder_lora": {"graph": "decoder_lora", "data": "decoder_data", "wasm": "decoder_lora_wasm",
                     "int8": "decoder_lora_wasm_int8", "step": "decoder_lora_step", "delta": "decoder_lora_delta"},
}


class IO:
    """The input and output names of the graphs the site runs, as onnxruntime-genai's genai_config.json
    writes them: a name, or a %-template of the layer (and the projection) for the per-layer ones.

    The encoder: pcm [1, N] float32 (or mel [1, 128, F] for an encoder without the front end) ->
    audio_features [1, A, H]. The decoder: inputs_embeds [B, S, H], or input_ids [B, S] int64 with
    audio_features [B, A, H] and audio_offset [1] int64 (webbuild.quantize.embeddings); attention_mask
    [B, T] int64, past_key / past_value per layer -> logits and present_key / present_value per layer.
    Its step form (webbuild.forms.step) answers next_token and margin instead of logits; the
    adapted decoder (webbuild.forms.lora) takes one lora input per layer, projection and factor.
    Optimum's merged decoders (the merged source layout, webbuild.zoo.export's too) share the decoder's
    names; the split and v2 source layouts have their own, which the fuse stage replaces by these.
    Read at call time (IO.next_token, not a copy), so a test can rename one name for a whole build."""

    pcm = "pcm"
    mel = "mel"
    audio_features = "audio_features"
    audio_offset = "audio_offset"
    input_ids = "input_ids"
    inputs_embeds = "inputs_embeds"
    attention_mask = "attention_mask"
    logits = "logits"
    next_token = "next_token"
    margin = "margin"
    past_key = "past_key_values.%d.key"
    past_value = "past_key_values.%d.value"
    present_key = "present.%d.key"
    present_value = "present.%d.value"
    lora = "lora.%d.%s.%s"  # layer, projection or group (q_proj, qkv_proj, ...), factor (down | up | DOWN_CODES | ...)

    @classmethod
    def past(cls, layer: int, kind: str) -> str:
        """The past input of `layer`, kind 'key' or 'value'."""
        return (cls.past_key if kind == "key" else cls.past_value) % layer

    @classmethod
    def present(cls, layer: int, kind: str) -> str:
        """The present output of `layer`, kind 'key' or 'value'."""
        return (cls.present_key if kind == "key" else cls.present_value) % layer

    @classmethod
    def pasts(cls, layers: int) -> list[str]:
        """Every past input, per layer key then value."""
        return [cls.past(i, kind) for i in range(layers) for kind in KV]

    @classmethod
    def presents(cls, layers: int) -> list[str]:
        """Every present output, per layer key then value."""
        return [cls.present(i, kind) for i in range(layers) for kind in KV]

    @classmethod
    def present_of_past(cls, names: list[str]) -> dict[str, str]:
        """{past input: the present output of its layer and kind} for the past inputs among `names`."""
        out: dict[str, str] = {}
        for kind, template in (("key", cls.past_key), ("value", cls.past_value)):
            out |= {n: cls.present(int(m[1]), kind) for n in names if (m := _fills(template, n))}
        return {n: out[n] for n in names if n in out}

    @classmethod
    def lora_inputs(cls, names: list[str]) -> list[str]:
        """The adapted decoder's lora inputs among `names`."""
        return [n for n in names if _fills(cls.lora, n)]

    @classmethod
    def lora_input(cls, layer: int, proj: str, factor: str) -> str:
        return cls.lora % (layer, proj, factor)

    @classmethod
    def lora_parts(cls, name: str) -> tuple[int, str, str] | None:
        """(layer, projection or group, factor) of a lora input's name; None for another name."""
        m = _fills(cls.lora, name)
        return (int(m[1]), m[2], m[3]) if m else None

    @classmethod
    def decoder(cls, layers: int) -> tuple[list[str], list[str]]:
        """(inputs, outputs) of the fused decoder (webbuild.fusion): inputs_embeds, attention_mask, the
        pasts -> logits, the presents. The presents are past + new positions long; fused from a static KV cache
        (`webbuild fuse` alone: a build refuses one) past and present are one buffer of fixed length, and the
        mask spans it."""
        return [cls.inputs_embeds, cls.attention_mask, *cls.pasts(layers)], [cls.logits, *cls.presents(layers)]

    @classmethod
    def names(cls) -> dict[str, str]:
        """runtime.json's `io`: every name and template above."""
        return {k: getattr(cls, k) for k in vars(IO) if isinstance(getattr(cls, k), str) and not k.startswith("_")}

    @classmethod
    def of(cls, names: dict[str, str]) -> type[IO]:
        """These names as a built site's runtime.json gives them (`io`), the others as here."""
        unknown = set(names) - set(IO.names())
        if unknown:
            raise ValueError(f"unknown graph names {sorted(unknown)}; expected some of {sorted(IO.names())}")
        return type("SiteIO", (IO,), dict(names))


KV = ("key", "value")


def _fills(template: str, name: str) -> re.Match | None:
    """Whether `name` is `template` filled in (%d: a number, %s: a word); the match holds the values."""
    pattern = re.escape(template).replace("%d", r"(\d+)").replace("%s", r"(\w+)")
    return re.fullmatch(pattern, name)

# The precision variants a build can ship, in the order the page prefers them: the float type of the
# decoder's audio_features, past and present (`dtype`), the WebGPU features an adapter needs to run it
# (`requires`), and the execution providers that may run it (`providers`: the fp16 graphs have int4
# lookups and fp16 kernels the wasm EP lacks, so wasm runs fp32). The manifest's variant entries carry
# them (webbuild.pipeline.state.Variant); runtime/probe.js chooseVariant picks by them.
VARIANTS: dict[str, dict] = {
    "fp16": {"dtype": "float16", "requires": ["shader-f16"], "providers": ["webgpu"]},
    "fp32": {"dtype": "float32", "requires": [], "providers": ["webgpu", "wasm"]},
}


def runs_on(variant: str, provider: str) -> bool:
    """Whether execution provider `provider` may run `variant`."""
    return provider in VARIANTS[variant]["providers"]


def runtime_names() -> dict:
    """runtime.json's keys for the names above (webbuild.pipeline.assemble.runtime_config)."""
    return {"files": {"tokens": TOKENS_FILE, "ort_module": f"{ORT_DIR}/{ORT_MODULE}", "ort_wasm": ORT_WASM},
            "roles": FILE_ROLES, "io": IO.names(), "variants": VARIANTS}

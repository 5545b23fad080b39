"""Assemble stage: the model folder the site runtime is written against.

Output (``ctx.work_dir / "model"``), one set per variant:

- ``encoder.onnx``: ``pcm`` [1, N] float32 16 kHz -> ``audio_features`` [1, A, H] (the mel
  front-end, with its leading silence, is prepended here when the source encoder still takes ``mel``);
- ``decoder.onnx`` + ``decoder.onnx.data``: ``inputs_embeds``, ``attention_mask``,
  ``past_key_values.{i}.key|value`` -> ``logits``, ``present.{i}.key|value``;
- ``embed_tokens.bin``: float32 [V, H] (a v2 source's int8 table, dequantized);
- ``runtime.json``: prompt ids, special ids, decoder shape: everything the browser needs so that
  it carries no tokenizer for the prompt;
- ``tokens.bin``: the decode table (see ``token_table``).
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import onnx
from tokenizers import Tokenizer

from webbuild.config import AUTO
from webbuild.errors import BuildError
from webbuild.forms.form import Report as FormsReport
from webbuild.forms.mel_frontend import MEL_FRONTEND
from webbuild.graph.census import op_census
from webbuild.graph.load import load_onnx
from webbuild.layouts import Layout, Table
from webbuild.pipeline.bpe_form import encoder_form, merges_section
from webbuild.pipeline.state import Variant
from webbuild.reference import source_v2
from webbuild.reference.chunk import DEFAULT_POLICY, ChunkPolicy
from webbuild.reference.prompt import (
    ANSWER_END,
    DEFAULT_LANGUAGES,
    DEFAULT_MAX_NEW_TOKENS,
    PROMPT_PREFIX,
    PROMPT_SUFFIX,
    SYSTEM_END,
    SYSTEM_LEAD,
    SYSTEM_START,
    TEXT_START,
    context_tokens,
    language_ids,
    max_positions,
    text_ids,
)
from webbuild.site.contract import IO, RUNTIME_FILE, TOKENS_FILE, runtime_names

RUNTIME_FORMAT = 1
# onnxruntime-web 1.30's WebGPU GroupQueryAttention takes another kernel when one run adds 32 or more
# tokens, which gave wrong results on SwiftShader once (31 exact to 5e-7, 32 off by 0.1 in the logits).
# Sites whose decoder has GQA start with prefill runs of at most this many tokens on WebGPU; the runtime's
# warm-up then compares one long run with such runs on the visitor's adapter and drops the limit where they
# agree (runtime/asr.js longRunsAgree): a 30 s clip's prompt in one run instead of 14.
WEBGPU_GQA_PREFILL_CHUNK = 31


def assemble_model(source: Path, layout: Layout, out: Path, decoder: Path | None = None,
                   encoder: Path | None = None, lead: int = 0, chunking: ChunkPolicy = DEFAULT_POLICY,
                   languages: tuple[str, ...] = DEFAULT_LANGUAGES, language: str = AUTO, context: str = "",
                   forms: FormsReport | None = None) -> Variant:
    """Write the runtime's fp32 model files into `out`; return them as the fp32 variant, roles encoder,
    encoder_data, decoder, decoder_data, embed (embed only for decoders that take inputs_embeds).

    `decoder` is a ready decoder graph with the merged interface (the fuse stage's output);
    without it the source's, where it has that interface already (`layout.fusion_optional`).
    `encoder`: the fuse stage's encoder, else the source's. `lead`: samples of lead the mel front-end
    puts before the audio. `chunking`: how the runtime cuts long audio (runtime.json `chunking`).
    `languages`, `language`: the model's languages and the page's default (runtime.json `prompt`); `context`:
    the page's default context text (runtime.json `prompt.context`). `forms`: where the mel front-end, a graph
    form, is recorded.
    """
    out.mkdir(parents=True, exist_ok=True)
    if decoder is None:
        if not layout.fusion_optional:
            raise BuildError(f"{source}: a {layout.name} source needs the fuse stage to make one decoder graph")
        decoder = source / layout.prefill
    save_graph(decoder, out / "decoder.onnx")
    _encoder(encoder or source / "encoder.onnx", out / "encoder.onnx", lead, forms or FormsReport())
    _table_files(source, layout, out)
    cfg = json.loads((source / "config.json").read_text())
    tok = Tokenizer.from_file(str(source / "tokenizer.json"))
    has_gqa = "GroupQueryAttention" in op_census(out / "decoder.onnx")
    rt = runtime_config(cfg, tok, prefill_chunk=WEBGPU_GQA_PREFILL_CHUNK if has_gqa else 0, chunking=chunking,
                        languages=languages, language=language, context=context)
    if has_gqa:
        check_rope_positions(out / "decoder.onnx", rt["max_positions"])
    (out / RUNTIME_FILE).write_text(json.dumps(rt, indent=1) + "\n")
    (out / TOKENS_FILE).write_bytes(token_table(tok) + merges_section(tok))  # the merges: runtime/bpe.js
    return Variant("fp32", out, present_files(out, {
        "encoder": "encoder.onnx", "encoder_data": "encoder.onnx.data",
        "decoder": "decoder.onnx", "decoder_data": "decoder.onnx.data", "embed": "embed_tokens.bin"}))


def _table_files(source: Path, layout: Layout, out: Path) -> None:
    """embed_tokens.bin (float32 [V, H]) and the config.json describing it, which the quantize stage
    reads: the source's, or its int8 table dequantized (webbuild.reference.source_v2)."""
    if layout.table is Table.FLOAT32:
        shutil.copyfile(source / "embed_tokens.bin", out / "embed_tokens.bin")
        shutil.copyfile(source / "config.json", out / "config.json")
        return
    cfg = json.loads((source / "config.json").read_text())
    table = source_v2.embed_table(source, cfg)
    table.tofile(out / "embed_tokens.bin")
    cfg.update(embed_tokens_shape=list(table.shape), embed_tokens_dtype="float32")
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def present_files(folder: Path, roles: dict[str, str]) -> dict[str, str]:
    """`roles` (role -> file name) without the files `folder` lacks."""
    return {role: name for role, name in roles.items() if (folder / name).is_file()}


def save_graph(src: Path, dest: Path) -> None:
    """Copy an ONNX graph to `dest`, its external data (if any) to one file `dest.name + '.data'`.

    onnxruntime-web resolves external data by the location written inside the graph, so the
    graph is re-saved with the new location rather than renamed on disk.
    """
    model = load_onnx(src)
    locations = {e.value for t in _external_tensors(model) for e in t.external_data if e.key == "location"}
    if not locations:
        shutil.copyfile(src, dest)
        return
    if len(locations) > 1:
        raise BuildError(f"{src}: external data spread over {sorted(locations)}; expected one file")
    data_name = dest.name + ".data"
    shutil.copyfile(src.parent / locations.pop(), dest.parent / data_name)
    for t in _external_tensors(model):
        for e in t.external_data:
            if e.key == "location":
                e.value = data_name
    onnx.save(model, str(dest))


def _external_tensors(model: onnx.ModelProto):
    return [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]


def _encoder(src: Path, dest: Path, lead: int, forms: FormsReport) -> None:
    """The encoder taking 16 kHz PCM: the source's, or one taking `mel` with the mel front-end (a graph form,
    recorded in `forms`) in front: the one mel implementation, in the graph."""
    inputs = [i.name for i in load_onnx(src).graph.input]
    if inputs == [IO.pcm]:
        save_graph(src, dest)
    elif inputs == [IO.mel]:
        forms.make(MEL_FRONTEND, "encoder", src, dest, lead)
    else:
        raise BuildError(f"{src}: expected one encoder input named {IO.pcm!r} or {IO.mel!r}, found {inputs}")


def runtime_config(cfg: dict, tok: Tokenizer, prefill_chunk: int = 0, chunking: ChunkPolicy = DEFAULT_POLICY,
                   languages: tuple[str, ...] = DEFAULT_LANGUAGES, language: str = AUTO, context: str = "") -> dict:
    """What the browser needs besides the graphs; the prompt is pre-tokenised here, each language's forced
    answer prefix too (the page has no tokenizer). The names the runtime looks files up by (file roles, the
    decode table, onnxruntime-web's files) come from webbuild.site.contract."""
    dec, special = cfg["decoder"], cfg["special_tokens"]
    ids = lambda text: tok.encode(text, add_special_tokens=False).ids  # noqa: E731
    forced = {name: language_ids(tok, name) for name in languages}
    positions = max_positions(len(ids(PROMPT_PREFIX)) + len(ids(PROMPT_SUFFIX)), chunking.max_seconds)
    return {
        "format": "webbuild-runtime", "format_version": RUNTIME_FORMAT,
        "sample_rate": 16000,
        "prompt": {"prefix": ids(PROMPT_PREFIX), "suffix": ids(PROMPT_SUFFIX),
                   "audio_pad": tok.token_to_id("<|audio_pad|>"), "languages": forced, "language": language,
                   "context": context_config(tok, context, positions, chunking, forced)},
        "eos_token_ids": special["eos_token_ids"],
        "answer": {"text_start": TEXT_START, "end": ANSWER_END},
        "decoder": {k: dec[k] for k in ("num_layers", "num_key_value_heads", "head_dim", "hidden_size",
                                        "vocab_size")},
        "max_new_tokens": DEFAULT_MAX_NEW_TOKENS,
        "max_chunk_seconds": chunking.max_seconds,
        "chunking": chunking.as_json(),
        "chunking_live": chunking.live().as_json(),  # the live mode's (runtime/chunk.js LiveChunker)
        # a forced language's few ids and the context text fit in the positions to spare (context_tokens)
        "max_positions": positions,
        "webgpu_prefill_chunk": prefill_chunk,  # 0: the whole prompt in one run
        **runtime_names(),
    }


def context_config(tok: Tokenizer, context: str, positions: int, chunking: ChunkPolicy,
                   forced: dict[str, list[int]]) -> dict | None:
    """runtime.json prompt.context: the default text, its budget, the system message's ids around
    "system\n" + text, and how runtime/bpe.js tokenises it; None where the tokenizer is of a shape it cannot."""
    form = encoder_form(tok)
    if form is None:
        if context:
            raise BuildError("model.yaml context: this model's tokenizer.json is not a byte-level BPE the page can "
                             "encode text with (GPT-2's or Qwen2's pre-tokeniser); remove context")
        return None
    ids = lambda text: tok.encode(text, add_special_tokens=False).ids  # noqa: E731
    budget = context_tokens(positions, len(ids(PROMPT_PREFIX)) + len(ids(PROMPT_SUFFIX)), chunking.max_seconds,
                            max((len(f) for f in forced.values()), default=0))
    used = len(text_ids(tok, SYSTEM_LEAD + context)) - len(text_ids(tok, SYSTEM_LEAD)) if context else 0
    if used > budget:
        raise BuildError(f"model.yaml context: {used} tokens, over the {budget} the prompt has room for "
                         "(runtime.json max_positions); shorten it")
    return {"text": context, "max_tokens": budget, "start": ids(SYSTEM_START), "lead": SYSTEM_LEAD,
            "end": ids(SYSTEM_END), **form}


def chunk_positions(source: Path, chunking: ChunkPolicy) -> int:
    """runtime.json's max_positions for a source folder (its tokenizer.json) and chunk policy."""
    tok = Tokenizer.from_file(str(source / "tokenizer.json"))
    ids = lambda text: tok.encode(text, add_special_tokens=False).ids  # noqa: E731
    return max_positions(len(ids(PROMPT_PREFIX)) + len(ids(PROMPT_SUFFIX)), chunking.max_seconds)


def check_rope_positions(decoder: Path, positions: int) -> None:
    """GroupQueryAttention's cos/sin caches must cover every position one chunk can reach (onnxruntime fails
    past them); the fuse stage sizes them from the model's maximum positions."""
    model = load_onnx(decoder)
    dims = {t.name: t.dims[0] for t in model.graph.initializer}
    rows = [dims[n.input[7]] for n in model.graph.node
            if n.op_type == "GroupQueryAttention" and len(n.input) > 7 and n.input[7] in dims]
    if rows and min(rows) < positions:
        raise BuildError(f"{decoder}: GroupQueryAttention's cos/sin caches hold {min(rows)} positions, but a chunk of "
                         f"long audio reaches {positions}; lower model.yaml chunking.max_seconds or raise the "
                         "source config.json's max_position_embeddings")


def token_table(tok: Tokenizer) -> bytes:
    """Decode table: u32 count, u32 offsets[count + 1], then every token's bytes back to back.

    Byte-level BPE tokens map each character back to one byte (GPT-2's byte alphabet); added
    (special) tokens decode to their UTF-8 text, as `Tokenizer.decode(skip_special_tokens=False)`.
    The browser concatenates a sequence's bytes and decodes them with a streaming TextDecoder.
    """
    to_byte = _unicode_to_byte()
    added = {t.content for t in tok.get_added_tokens_decoder().values()}
    count = tok.get_vocab_size(with_added_tokens=True)
    pieces = []
    for i in range(count):
        t = tok.id_to_token(i)
        if t is None:
            pieces.append(b"")
        elif t in added:
            pieces.append(t.encode())
        else:
            pieces.append(bytes(to_byte[c] for c in t))
    offsets = [0]
    for p in pieces:
        offsets.append(offsets[-1] + len(p))
    return struct.pack(f"<{count + 2}I", count, *offsets) + b"".join(pieces)


def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode (the ByteLevel pre-tokenizer's alphabet)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table

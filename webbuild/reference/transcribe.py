"""Reference transcription in Python with onnxruntime: mel -> encoder -> greedy decoding.

Source folders are recognised by their files (webbuild.layouts.detect), and their layout's entry says
which decoder class below runs them and how their embedding table is read. Every decoder exposes the
same two calls, `prefill` and `step`, so the greedy loop is written once.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from tokenizers import Tokenizer

from webbuild import layouts
from webbuild.config import LANGUAGE_NAME
from webbuild.errors import SourceError
from webbuild.graph import cpu_session as cpu
from webbuild.graph.load import FIX, load_onnx
from webbuild.layouts import Decoder, Table
from webbuild.reference import site_bpe, source_v2
from webbuild.reference.audio import stream_wav
from webbuild.reference.chunk import (
    DEFAULT_POLICY,
    ChunkPolicy,
    Sizes,
    chunks_of,
    live_chunks,
    split_at_quiet,
    to_speech,
)
from webbuild.reference.mel import LEAD_METADATA, SAMPLE_RATE, frame_count, lead_length, log_mel
from webbuild.reference.prompt import (
    DEFAULT_MAX_NEW_TOKENS,
    PROMPT_PREFIX,
    PROMPT_SUFFIX,
    Prompt,
    audio_token_count,
    build_prompt,
    context_tokens,
    language_ids,
    max_positions,
    parse_answer,
    parse_language,
    prefix_ids,
)
from webbuild.reference.source_files import check_source, read_json
from webbuild.reference.vad import Vad, VadPolicy, speech_segments, window_speech
from webbuild.site.contract import IO


def cpu_session(path: Path) -> ort.InferenceSession:
    """An onnxruntime CPU session that logs only errors. An `int8` wasm twin (webbuild.forms.wasm_twin)
    gets the uint8 weights its plan derives from the int4 ones, as the page derives them at load."""
    opts = cpu.options()
    plan_path = Path(path).with_name(Path(path).name.removesuffix(".onnx") + ".int8.json")
    kept = _int8_initializers(opts, Path(path), json.loads(plan_path.read_text())) if plan_path.is_file() else []
    session = cpu.session(str(path), opts)
    session.int8_weights = kept  # the session reads them: alive as long as it is
    return session


def _int8_initializers(opts: ort.SessionOptions, path: Path, plan: dict) -> list:
    """The int8 twin's derived weights, handed to onnxruntime in place of the file no server has."""
    from webbuild.graph.packing import int8_weights

    derived = int8_weights(plan, np.memmap(path.parent / plan["source"], np.uint8, mode="r"))
    model = onnx.load(str(path), load_external_data=False)  # not load_onnx: the derived file is on no disk
    names, values = [], []
    for t in model.graph.initializer:
        place = {e.key: e.value for e in t.external_data}
        if place.get("location") == plan["file"]:
            at, size = int(place.get("offset", 0)), int(place["length"])
            names.append(t.name)
            values.append(ort.OrtValue.ortvalue_from_numpy(derived[at:at + size].reshape(list(t.dims))))
    opts.add_external_initializers(names, values)
    return [derived, values]


def source_session(path: Path) -> ort.InferenceSession:
    """cpu_session of a user's graph, checked first: onnxruntime reports a corrupt file or a truncated
    weights file as a traceback, webbuild.graph.load as one line naming the file."""
    load_onnx(path)  # checked before another library opens it
    try:
        return cpu_session(path)
    except Exception as exc:  # onnxruntime's errors (Fail, InvalidGraph, ...) share no base class but Exception
        if not type(exc).__module__.startswith("onnxruntime"):
            raise
        reason = str(exc).split("] : ", 1)[-1].splitlines()[0]
        raise SourceError(f"{path}: onnxruntime cannot load it ({reason}); {FIX}") from None


def takes_token_ids(decoder: Path, io: type[IO] = IO) -> bool:
    """Whether a built decoder graph takes input_ids (its own lookup) rather than inputs_embeds (a float build's,
    quantize.method none, whose tokens are looked up in the shipped embed_tokens.bin)."""
    return io.input_ids in {i.name for i in onnx.load(str(decoder), load_external_data=False).graph.input}


def embed_table(model_dir: Path, cfg: dict) -> np.ndarray:
    """The float token embeddings of a split export or a float build (embed_tokens.bin; dtype and shape from cfg)."""
    dtype = np.dtype(cfg.get("embed_tokens_dtype", "float32"))
    shape = cfg.get("embed_tokens_shape") or [cfg["decoder"]["vocab_size"], cfg["decoder"]["hidden_size"]]
    return np.memmap(model_dir / "embed_tokens.bin", dtype=dtype, mode="r", shape=tuple(shape))


def _prompt_embeds(table: np.ndarray, prompt: Prompt, audio: np.ndarray) -> np.ndarray:
    """[1, S, H] float32: the prompt's table rows with the audio features over its audio placeholders."""
    x = np.asarray(table[prompt.ids], np.float32)[None].copy()
    x[0, prompt.audio_offset:prompt.audio_offset + prompt.audio_tokens] = audio[0]
    return x


class SplitDecoder:
    """decoder_init (prefill with the audio splice) + decoder_step (one token, stacked KV): graphs
    (prefill, step) of `model_dir`; `embed` the float [V, H] table; `cfg` its config.json."""

    def __init__(self, model_dir: Path, graphs: tuple[str, ...], embed: np.ndarray, cfg: dict):
        init, step = graphs
        self.init = source_session(model_dir / init)
        self.step_sess = source_session(model_dir / step)
        self.embed = embed

    def prefill(self, prompt: Prompt, audio: np.ndarray):
        n = len(prompt.ids)
        logits, keys, values = self.init.run(None, {
            "input_ids": np.array([prompt.ids], np.int64), "position_ids": np.arange(n, dtype=np.int64)[None],
            "audio_features": audio, "audio_offset": np.array([prompt.audio_offset], np.int64)})
        return logits[0, -1], (keys, values, n)

    def step(self, token: int, state):
        keys, values, pos = state
        logits, keys, values = self.step_sess.run(None, {
            "input_embeds": np.asarray(self.embed[[token]], np.float32)[None],
            "position_ids": np.array([[pos]], np.int64), "past_keys": keys, "past_values": values})
        return logits[0, -1], (keys, values, pos + 1)


class V2Decoder(SplitDecoder):
    """decoder_init takes the prompt's embeddings (table rows, audio spliced in here), decoder_step as
    SplitDecoder's: layout v2 (webbuild.reference.source_v2)."""

    def prefill(self, prompt: Prompt, audio: np.ndarray):
        n = len(prompt.ids)
        logits, keys, values = self.init.run(None, {
            "input_embeds": _prompt_embeds(self.embed, prompt, audio),
            "position_ids": np.arange(n, dtype=np.int64)[None]})
        return logits[0, -1], (keys, values, n)


class MergedDecoder:
    """optimum-style decoder: inputs_embeds + attention_mask + per-layer past -> logits + present."""

    def __init__(self, model_dir: Path, graphs: tuple[str, ...], embed: np.ndarray, cfg: dict):
        (graph,) = graphs
        self.sess = source_session(model_dir / graph)
        self.embed = embed
        self.past_names = list(IO.present_of_past([i.name for i in self.sess.get_inputs()]))
        dec = cfg["decoder"]
        self.empty = np.zeros((1, dec["num_key_value_heads"], 0, dec["head_dim"]), np.float32)

    def _run(self, x: np.ndarray, past: dict, total: int):
        out = self.sess.run(None, {IO.inputs_embeds: x, IO.attention_mask: np.ones((1, total), np.int64), **past})
        return out[0][0, -1], (dict(zip(self.past_names, out[1:])), total)

    def prefill(self, prompt: Prompt, audio: np.ndarray):
        x = _prompt_embeds(self.embed, prompt, audio)
        return self._run(x, {n: self.empty for n in self.past_names}, len(prompt.ids))

    def step(self, token: int, state):
        past, total = state
        return self._run(np.asarray(self.embed[[token]], np.float32)[None], past, total + 1)


class IdsDecoder:
    """A built decoder (decoder.<variant>.onnx): input_ids + audio splice inside the graph,
    attention_mask and per-layer past -> logits, present."""

    def __init__(self, path: Path, decoder_cfg: dict, adapter: dict[str, np.ndarray] | None = None,
                 io: type[IO] = IO):
        """io: the graph's input and output names (a built site's: IO.of(runtime.json's io))."""
        self.sess = cpu_session(path)
        self.io = io
        types = {i.name: i.type for i in self.sess.get_inputs()}
        self.dtype = np.float16 if types[io.audio_features] == "tensor(float16)" else np.float32
        # an adapted decoder's lora.* inputs (docs/adapters.md), which have no default: without an adapter,
        # empty ones ([in, 0] and [0, out]) add nothing, the base model
        self.adapter = {name: w.astype(self.dtype) for name, w in (adapter or {}).items()}
        if not self.adapter:
            shapes = {i.name: i.shape for i in self.sess.get_inputs()}
            self.adapter = {n: np.zeros(lora_empty(shapes[n]), self.dtype) for n in io.lora_inputs(list(shapes))}
        self.past_names = list(io.present_of_past(list(types)))
        d = decoder_cfg
        self.empty = np.zeros((1, d["num_key_value_heads"], 0, d["head_dim"]), self.dtype)
        self.no_audio = np.zeros((1, 0, d["hidden_size"]), self.dtype)

    def _run(self, ids, audio, offset: int, past: dict, total: int):
        io = self.io
        out = self.sess.run(None, {io.input_ids: np.array([ids], np.int64), io.audio_features: audio,
                                   io.audio_offset: np.array([offset], np.int64),
                                   io.attention_mask: np.ones((1, total), np.int64), **past, **self.adapter})
        return out[0][0, -1].astype(np.float32), (dict(zip(self.past_names, out[1:])), total)

    def prefill(self, prompt: Prompt, audio: np.ndarray):
        past = {n: self.empty for n in self.past_names}
        return self._run(prompt.ids, audio.astype(self.dtype), prompt.audio_offset, past, len(prompt.ids))

    def step(self, token: int, state):
        past, total = state
        return self._run([token], self.no_audio, 0, past, total + 1)


def lora_empty(shape: list) -> tuple[int, ...]:
    """The empty value of an adapted decoder's lora.* input of `shape` ([in, rank] or [rank, out], the
    rank symbolic): its rank 0."""
    return tuple(d if isinstance(d, int) else 0 for d in shape)


class TokenizerCodec:
    """Prompt and decoding through a source export's tokenizer.json."""

    languages = None  # a source export lists none: any name written as its answers write them is forced

    default_context = ""  # a source export has no model.yaml default

    def __init__(self, tok: Tokenizer):
        self.tokenizer = tok

    def prompt(self, audio_tokens: int, language: str | None = None, context: str = "") -> Prompt:
        return build_prompt(self.tokenizer, audio_tokens, language, context)

    def check_context(self, context: str, language: str | None = None) -> None:
        """A context over the budget a site built from this export would give it (with `language` forced)
        fails here, once."""
        ids = lambda text: self.tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
        text_tokens = len(ids(PROMPT_PREFIX)) + len(ids(PROMPT_SUFFIX))
        seconds = DEFAULT_POLICY.max_seconds
        budget = context_tokens(max_positions(text_tokens, seconds), text_tokens, seconds, len(self.forced(language)))
        check_context_length(context_length(self.tokenizer, context), budget)

    def forced(self, language: str | None) -> list[int]:
        """The ids of `language`'s answer prefix (none for None)."""
        if language is None:
            return []
        if not re.fullmatch(LANGUAGE_NAME, language):
            raise SourceError(f"language {language!r} is not a name like 'English' (a capital, then letters), as "
                              "the model's answers name languages")
        return language_ids(self.tokenizer, language)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)


class SiteCodec:
    """Prompt and decoding from what a built site ships: runtime.json and the tokens.bin table."""

    def __init__(self, runtime: dict, table: bytes):
        self.prefix, self.suffix = runtime["prompt"]["prefix"], runtime["prompt"]["suffix"]
        self.pad = runtime["prompt"]["audio_pad"]
        self.languages: dict[str, list[int]] = runtime["prompt"].get("languages", {})  # older sites: none
        self.context: dict | None = runtime["prompt"].get("context")  # older sites, other tokenizers: none
        self.default_context = self.context["text"] if self.context else ""
        count = int(np.frombuffer(table, "<u4", 1)[0])
        self.offsets = np.frombuffer(table, "<u4", count + 1, offset=4)
        self.data = table[4 * (count + 2):]
        self.merges = site_bpe.merges_of(table)
        self._encoder: Tokenizer | None = None

    def prompt(self, audio_tokens: int, language: str | None = None, context: str = "") -> Prompt:
        prefix = self.context_prefix(context)
        return Prompt(prefix + [self.pad] * audio_tokens + self.suffix + self.forced(language), len(prefix),
                      audio_tokens)

    def context_prefix(self, context: str) -> list[int]:
        """The ids before the audio with `context` in the system message, as the page's runtime/bpe.js makes
        them from runtime.json prompt.context and tokens.bin's merges."""
        if not context:
            return self.prefix
        if self.context is None or not self.merges:
            raise SourceError("this site cannot take context text (built before context text, or its tokenizer is "
                              "not a byte-level BPE the page encodes); leave out --context")
        if self._encoder is None:
            count = len(self.offsets) - 1
            raw = [bytes(self.data[self.offsets[i]:self.offsets[i + 1]]) for i in range(count)]
            self._encoder = site_bpe.site_tokenizer(self.context, raw, self.merges)
        text = self._encoder.encode(self.context["lead"] + context, add_special_tokens=False).ids
        return self.context["start"] + text + self.context["end"]

    def check_context(self, context: str, language: str | None = None) -> None:
        """A context over runtime.json's prompt.context.max_tokens fails here, once (`language`: counted in it)."""
        used = len(self.context_prefix(context)) - len(self.prefix)
        check_context_length(used, self.context["max_tokens"] if self.context else 0)

    def forced(self, language: str | None) -> list[int]:
        """The ids runtime.json gives `language`'s answer prefix, as the page puts them after the suffix."""
        if language is None:
            return []
        if language not in self.languages:
            raise SourceError(f"no language {language!r} in this site; it has "
                              f"{', '.join(self.languages) or 'none (a build before languages)'}")
        return self.languages[language]

    def decode(self, ids: list[int]) -> str:
        """The ids' bytes as text; an id outside the table (a model's logits may be wider than its
        vocabulary) has none, as in the page's runtime/tokens.js."""
        count = len(self.offsets) - 1
        raw = b"".join(self.data[self.offsets[i]:self.offsets[i + 1]] for i in ids if 0 <= i < count)
        return raw.decode("utf-8", errors="replace")


def context_length(tok: Tokenizer, context: str) -> int:
    """The tokens `context` adds to the prompt (runtime/bpe.js counts the same)."""
    return len(prefix_ids(tok, context)) - len(prefix_ids(tok, ""))


def check_context_length(tokens: int, budget: int) -> None:
    if tokens > budget:
        raise SourceError(f"the context text is {tokens} tokens, over the {budget} the prompt has room for (the "
                          "longest chunk's prompt and answer must fit the decoder's positions); shorten it")


def pick(logits: np.ndarray) -> tuple[int, float]:
    """Greedy choice over one row of logits (the first maximum wins ties) and its margin: the chosen
    logit minus the runner-up's, in float64 from the float32 logits, as the site's runtime/greedy.js
    computes it, so that `webbuild verify` compares like with like."""
    token = int(np.argmax(logits))
    runner_up, best = np.partition(logits, -2)[-2:]  # the two largest values, ascending (a tie: equal)
    return token, float(best) - float(runner_up)


@dataclass
class Decoded:
    """Greedy decoding's tokens and, per token, its margin (pick)."""

    tokens: list[int]
    margins: list[float]


@dataclass
class LiveChunk:
    """A chunk of live audio: [start, end) in 16 kHz samples, and its final decoding."""

    start: int
    end: int
    decoded: Decoded


@dataclass
class Transcriber:
    encoder: ort.InferenceSession
    decoder: SplitDecoder | V2Decoder | MergedDecoder | IdsDecoder
    codec: TokenizerCodec | SiteCodec
    eos_ids: frozenset[int]
    keep: object = None  # e.g. the temporary folder a built site was reassembled into
    io: type[IO] = IO  # the graphs' input and output names (a built site's own, load_site)
    lead: int = 0  # samples of lead log_mel puts before the audio (encoders taking mel; webbuild.reference.mel)
    policy: ChunkPolicy = DEFAULT_POLICY  # how long audio is cut (a built site's runtime.json `chunking`)
    live_policy: ChunkPolicy = DEFAULT_POLICY.live()  # how live audio is cut (runtime.json `chunking_live`)
    language: str | None = None  # forced (its answer prefix after the prompt), or None: the model names it
    context: str = ""  # the context text in the system message (a built site's: model.yaml's, load_site)
    vad: Vad | None = None  # speech detection (a built site's runtime.json `vad`, load_site); None: all is speech

    def force_language(self, language: str | None) -> None:
        """Force `language` on every decode from now on (None: automatic); an unknown one fails here, once."""
        self.codec.forced(language)
        self.language = language

    def give_context(self, context: str) -> None:
        """Put `context` in the system message of every prompt from now on ('': none); one over the prompt's
        budget fails here, once."""
        self.codec.check_context(context, self.language)
        self.context = context

    @property
    def takes_pcm(self) -> bool:
        return self.encoder.get_inputs()[0].name == self.io.pcm

    @property
    def front_end_lead(self) -> int:
        """Samples of lead put before the audio: by the graph's front-end (its metadata says how many)
        for an encoder taking PCM, else by log_mel."""
        if self.takes_pcm:
            return int(self.encoder.get_modelmeta().custom_metadata_map.get(LEAD_METADATA, 0))
        return self.lead

    def audio_features(self, pcm: np.ndarray) -> np.ndarray:
        # built encoders carry the mel front-end in the graph and take PCM directly
        if self.takes_pcm:
            return self.encoder.run(None, {self.io.pcm: np.asarray(pcm, np.float32)[None]})[0]
        return self.encoder.run(None, {self.io.mel: log_mel(pcm, self.lead)[None]})[0]

    def expected_tokens(self, pcm: np.ndarray) -> range:
        """Audio tokens the encoder may give for `pcm`. A graph's front-end measures the chunk's leading
        background in float32 as numpy does, but a window on the 6 dB edge may fall either way: any
        lead from none to the whole."""
        if self.takes_pcm:
            lo, hi = 0, self.front_end_lead
        else:
            lo = hi = lead_length(pcm, self.lead)
        return range(audio_token_count(frame_count(len(pcm), lo)), audio_token_count(frame_count(len(pcm), hi)) + 1)

    def decode(self, pcm: np.ndarray, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> Decoded:
        """Greedy tokens of `pcm` (end of sequence left out) with their margins."""
        audio = self.audio_features(pcm)
        expected = self.expected_tokens(pcm)
        if audio.shape[1] not in expected:
            raise RuntimeError(f"encoder gave {audio.shape[1]} audio tokens, expected "
                               f"{expected.start if len(expected) == 1 else f'{expected.start}-{expected[-1]}'}")
        logits, state = self.decoder.prefill(self.codec.prompt(audio.shape[1], self.language, self.context), audio)
        out = Decoded([], [])
        for _ in range(max_new_tokens):
            token, margin = pick(logits)
            if token in self.eos_ids:
                break
            out.tokens.append(token)
            out.margins.append(margin)
            logits, state = self.decoder.step(token, state)
        return out

    def decode_file(self, path: Path, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> list[Decoded]:
        """Each chunk's decoding of a WAV file of any length, cut as the page cuts it (webbuild.reference.chunk),
        the file read and resampled as the chunks are decoded: memory bounded by the chunk length. With speech
        detection the file is read twice: its stretches of speech first, then the chunks' parts within them
        (chunk.py to_speech); a file without speech has no chunk."""
        speech = None
        if self.vad is not None:
            probs, samples = self.vad.probabilities(stream_wav(path))
            speech = self.vad.stretches(speech_segments(probs, samples, self.vad.policy))
        return [self.decode(chunk, max_new_tokens)
                for chunk in chunks_of(stream_wav(path), SAMPLE_RATE, self.policy, speech)]

    def chunk_ranges(self, pcm: np.ndarray) -> list[tuple[int, int]]:
        """[start, end) of each chunk of `pcm` that decode_file (and the page) transcribes: the chunk policy's cuts,
        with speech detection their parts within stretches of speech."""
        cuts = split_at_quiet(pcm, SAMPLE_RATE, self.policy)
        if self.vad is None:
            return cuts
        speech, keep = self.vad.stretches(self.vad.segments(pcm)), Sizes.of(self.policy, SAMPLE_RATE).keep
        return [span for s, e in cuts for span in to_speech(s, e, speech, keep)]

    def decode_live(self, path: Path, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> list[LiveChunk]:
        """Each chunk of a WAV file as the page's live mode cuts it when fed the file's frames (the live
        policy, chunk.py LiveChunker), with its final decoding: the page's finalized text, chunk by chunk (a chunk
        without speech is not transcribed, as in the page; with speech detection, nor one whose own windows hold
        no speech segment: vad.py window_speech)."""
        policy, vad = self.live_policy, self.vad
        probs = None if vad is None else vad.probabilities(stream_wav(path))[0]

        def spoken(start: int, end: int, speech: bool) -> bool:
            return speech and (vad is None or probs is None or window_speech(probs, start, end, vad.policy))
        return [LiveChunk(start, start + len(chunk), self.decode(chunk, policy.token_budget(
                    len(chunk), SAMPLE_RATE, max_new_tokens)) if spoken(start, start + len(chunk), speech)
                    else Decoded([], []))
                for start, chunk, speech in live_chunks(stream_wav(path), SAMPLE_RATE, policy)]

    def file_text(self, chunks: list[Decoded]) -> str:
        """The chunks' texts joined as the page joins them (the empty ones left out)."""
        return " ".join(t for t in (self.text(c.tokens) for c in chunks) if t)

    def generate(self, pcm: np.ndarray, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> list[int]:
        return self.decode(pcm, max_new_tokens).tokens

    def answer(self, tokens: list[int]) -> str:
        """The decoded answer: a forced language's prefix, then `tokens`."""
        return self.codec.decode(self.codec.forced(self.language) + tokens)

    def text(self, tokens: list[int]) -> str:
        return parse_answer(self.answer(tokens))

    def language_of(self, tokens: list[int]) -> str | None:
        """The language the answer names (the forced one where forced), None where it names none."""
        return parse_language(self.answer(tokens))

    def file_language(self, chunks: list[Decoded]) -> str | None:
        """The language of a file's first chunk naming one (chunks of silence may name none)."""
        return next((lang for c in chunks if (lang := self.language_of(c.tokens))), None)

    def transcribe(self, pcm: np.ndarray, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> str:
        return self.text(self.generate(pcm, max_new_tokens))


def site_model_dir(path: Path) -> Path | None:
    """The folder holding manifest.json when `path` is a built site (dist/) or its model/ folder."""
    for candidate in (Path(path) / "model", Path(path)):
        if (candidate / "manifest.json").is_file():
            return candidate
    return None


def load_transcriber(model_dir: Path, variant: str | None = None, lead: int = 0,
                     adapter: str | None = None, ep: str = "webgpu") -> Transcriber:
    """A Transcriber for a source export (any layout of webbuild.layouts) or a built site's `variant` (None:
    fp32), with the site's LoRA `adapter` on (a name of its manifest's `adapters`). `lead`: samples of lead
    (webbuild.reference.mel) before the audio where the encoder takes mel (a built site's graphs carry
    their own front-end and ignore it)."""
    model_dir = Path(model_dir)
    if (site := site_model_dir(model_dir)) is not None:
        return load_site(site, variant or "fp32", adapter, ep)
    if variant is not None:  # once ignored: `--variant fp8` on an export ran its own graphs and exited 0
        raise SourceError(f"{model_dir}: --variant {variant} picks one of a built site's variants, and this is a "
                          "source export, whose graphs have one precision; leave --variant out, or pass a built "
                          "site's folder")
    if adapter is not None:
        raise SourceError(f"{model_dir}: --adapter needs a built site (its manifest lists the adapters the build "
                          "packed); build one with `webbuild model.yaml` and pass its folder")
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise SourceError(f"{model_dir}: no config.json; pass a model folder (a source export or a built site)")
    cfg = check_source(model_dir, found) if (found := layouts.detect(model_dir)) else read_json(cfg_path)
    decoder = _source_decoder(model_dir, cfg)
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    eos = frozenset(cfg["special_tokens"]["eos_token_ids"])
    return Transcriber(source_session(model_dir / "encoder.onnx"), decoder, TokenizerCodec(tok), eos, lead=lead)


# how each layout's decoder is called and its table read (webbuild.layouts' Decoder and Table)
DECODERS: dict[Decoder, type[SplitDecoder] | type[MergedDecoder]] = {
    Decoder.SPLIT: SplitDecoder, Decoder.SPLIT_EMBEDS: V2Decoder, Decoder.MERGED: MergedDecoder}
TABLES = {Table.FLOAT32: embed_table, Table.INT8_ROWS: source_v2.embed_table}
BUILT_DECODER = "decoder.onnx"  # a build's fused decoder, MergedDecoder's interface


def _source_decoder(model_dir: Path, cfg: dict) -> SplitDecoder | V2Decoder | MergedDecoder:
    """The decoder of a source folder, by the layout its files tell, or of a build's model folder."""
    layout = layouts.detect(model_dir)
    if layout is not None:
        return DECODERS[layout.decoder](model_dir, layout.graphs, TABLES[layout.table](model_dir, cfg), cfg)
    if (model_dir / BUILT_DECODER).is_file():
        return MergedDecoder(model_dir, (BUILT_DECODER,), embed_table(model_dir, cfg), cfg)
    raise SourceError(f"{model_dir}: found none of {layouts.detect_hint()}, {BUILT_DECODER} (built model)")


def cpu_form(decoder: Path) -> Path:
    """`decoder`, or a copy beside it with the Q/K norms taken back out of GroupQueryAttention: the
    site's WebGPU form, which onnxruntime CPU refuses (webbuild.forms.webgpu)."""
    from webbuild.fusion import qk_norm_in_gqa
    from webbuild.graph.files import rewrite_file

    explicit = decoder.with_name(decoder.name.removesuffix(".onnx") + ".cpu.onnx")
    return explicit if rewrite_file(decoder, explicit, qk_norm_in_gqa.take_out) else decoder


def site_adapter(site: Path, manifest: dict, name: str, out: Path) -> dict[str, np.ndarray]:
    """The lora.* inputs of the site's adapter `name`, unpacked from its file."""
    from webbuild.site.adapter_pack import unpack
    from webbuild.site.manifest import reassemble

    adapters = manifest.get("adapters", {})
    if name not in adapters:
        raise SourceError(f"{site}: no adapter {name!r}; the site has "
                          f"{', '.join(adapters) or 'none (model.yaml adapters: adds them)'}")
    entry = adapters[name]
    reassemble(site, manifest, entry["file"], out / entry["file"])
    return unpack((out / entry["file"]).read_bytes(), entry["tensors"], entry["precision"])


def load_site(site: Path, variant: str = "fp32", adapter: str | None = None, ep: str = "webgpu") -> Transcriber:
    """The Python reference on a built site's own graphs, reassembled from its shards; with `adapter`,
    the adapted decoder fed that adapter's weights as the browser feeds them (docs/adapters.md). `ep`
    'wasm': the graphs the wasm EP runs (the wasm twins where the variant has them, an int8 twin with the
    weights the page derives), as the page on wasm runs them."""
    import tempfile

    from webbuild.site.contract import RUNTIME_FILE, TOKENS_FILE
    from webbuild.site.manifest import MANIFEST_NAME, check_shards, load_manifest, reassemble, verify_manifest

    manifest = load_manifest(site)
    check_shards(site, manifest)  # as the page checks what it downloads
    if problems := verify_manifest(site, check_files=False):  # the manifest's own structure
        raise SourceError(f"{site / MANIFEST_NAME}: {problems[0].removeprefix('manifest: ')}; rebuild the site "
                          "or copy it again")
    if variant not in manifest["variants"]:
        raise SourceError(f"{site}: no variant {variant!r}; the site has {', '.join(manifest['variants'])}")
    tmp = tempfile.TemporaryDirectory(prefix="webbuild-site-")
    roles = manifest["variants"][variant]  # file names by role: encoder, decoder, ...
    out = Path(tmp.name)
    for name in roles["files"] + [RUNTIME_FILE, TOKENS_FILE]:
        reassemble(site, manifest, name, out / name)
    runtime = json.loads((out / RUNTIME_FILE).read_text())
    io = IO.of(runtime.get("io", {}))  # the site's own graph names (older sites: none, the defaults)
    encoder = cpu_session(out / roles.get("encoder_wasm" if ep == "wasm" else "encoder", roles["encoder"]))
    # an adapter the site lacks is its one-line error before any graph of it is looked for
    weights = None if adapter is None else site_adapter(site, manifest, adapter, out)
    role = "decoder" if adapter is None else "decoder_lora"
    graph = out / roles[f"{role}_wasm"] if ep == "wasm" and f"{role}_wasm" in roles else cpu_form(out / roles[role])
    decoder: IdsDecoder | MergedDecoder
    if takes_token_ids(graph, io):
        decoder = IdsDecoder(graph, runtime["decoder"], weights, io=io)
    else:  # a float build's decoder takes embeddings: the page looks the tokens up in the shipped table
        cfg = {"decoder": runtime["decoder"], "embed_tokens_dtype": roles.get("dtype", "float32")}
        decoder = MergedDecoder(graph.parent, (graph.name,), embed_table(out, cfg), cfg)
    codec = SiteCodec(runtime, (out / TOKENS_FILE).read_bytes())
    return Transcriber(encoder, decoder, codec, frozenset(runtime["eos_token_ids"]), keep=tmp, io=io,
                       policy=ChunkPolicy.of(runtime), live_policy=ChunkPolicy.of_live(runtime),
                       context=codec.default_context, vad=site_vad(site, manifest, runtime, out))


def site_vad(site: Path, manifest: dict, runtime: dict, out: Path) -> Vad | None:
    """The site's speech detection: its own copy of the model (a manifest file) under runtime.json's `vad`."""
    from webbuild.site.manifest import reassemble

    if (policy := VadPolicy.of(runtime)) is None:
        return None
    reassemble(site, manifest, policy.file, out / policy.file)
    return Vad(out / policy.file, policy)

"""model.yaml: the typed build configuration, validated with precise, one-line-per-problem errors."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import ErrorDetails

from webbuild import layouts
from webbuild.adapters import adapter_problems
from webbuild.errors import ConfigError

LANGUAGE_NAME = r"[A-Z][A-Za-z]*"  # as Qwen3-ASR's answers name them: English, Chinese, Cantonese, ...
AUTO = "auto"  # no language forced: the model names the one it heard

DEFAULT_SHARD_BYTES = 25 * 1024 * 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Strict):
    layout: str = Field(
        description=f"how the source export is laid out, by name: {layouts.describe()}. Old spellings, "
                    f"accepted with a deprecation line: {layouts.aliases_text()}",
        json_schema_extra={"allowed": list(layouts.NAMES)})
    dir: Path = Field(description="folder of the source export, relative to model.yaml")

    @field_validator("layout")
    @classmethod
    def _known_layout(cls, name: str) -> str:
        """The canonical name of a layout (webbuild.layouts) or of an old spelling of one."""
        entry = layouts.find(name, "source.layout")
        if entry is None:
            raise ValueError(f"expected one of {layouts.names_text()}")
        return entry.name


class Fusion(_Strict):
    enabled: bool = Field(True, description="operator fusion of a source in layout "
                                            f"{' or '.join(e.name for e in layouts.LAYOUTS if e.fusion_optional)}; "
                                            "the others are always fused, since the fuse stage also makes their "
                                            "one decoder graph (merging decoder_init and decoder_step)")
    prune_lm_head: bool = Field(True, description="compute logits for the last position only")
    strict: bool = Field(False, description="stop the build with exit code 1 when an attention or a norm is left "
                                            "unfused (the error lists which rule, where and why); otherwise the "
                                            "build's closing table lists them and the build goes on")
    # false: Q, K, V stay three MatMulNBits, which onnxruntime-web's WebGPU EP fuses with the norm
    # before them into one MatMulNBitsQkv at session creation (5 dispatches per layer instead of 7);
    # true: one packed projection + Split, fewer nodes in the file but no runtime fusion
    pack_qkv: bool = Field(False, description="one packed Q/K/V projection + Split; left apart (false), "
                                              "onnxruntime-web's WebGPU EP fuses them with the norm before them "
                                              "into one MatMulNBitsQkv dispatch")
    step_attention: Literal["direct", "gqa"] = Field(
        "direct", description="the captured decode step's attention: direct, written out over the static KV cache, "
                              "every kernel dispatched directly; gqa, onnxruntime's GroupQueryAttention, whose decode "
                              "kernels dispatch indirectly under graph capture, which Chromium validates at about "
                              "0.4 ms each (docs/graph-capture.md)")


class Quantize(_Strict):
    """The `quantize:` block, and the one place the quantization defaults are written: webbuild.quantize
    takes this value as its settings, and `webbuild fuse` (its help too) quantizes with `Quantize()`."""

    method: Literal["rtn", "hqq", "none"] = Field("rtn", description="how the decoder's weights are quantized: rtn "
                                                  "(round to nearest), hqq, or none (no quantize stage: float "
                                                  "weights, no fp16 variant, encoder.precision unused)")
    bits: Literal[4, 8] = Field(4, description="bits per MatMulNBits weight")
    block_size: Literal[16, 32, 64, 128] = Field(32, description="weights per quantization block (one scale each)")
    accuracy_level: Literal[0, 1, 2, 3, 4] = Field(4, description="the decoder's MatMulNBits accuracy_level, the "
                                                   "lowest compute precision allowed (0 unset, 1 fp32, 2 fp16, "
                                                   "3 bf16, 4 int8); the encoder always gets 0. The "
                                                   "WebGPU decoder takes webgpu_accuracy_level instead; "
                                                   "this one serves the wasm fallback and the build's "
                                                   "own check")
    webgpu_accuracy_level: Literal[0, 1, 2, 3, 4] = Field(
        0, description="MatMulNBits accuracy_level of the decoder the site runs on WebGPU. 0 (default): "
                       "onnxruntime-web decodes each norm + Q/K/V and gate + up + SiLU group in one fused "
                       "dispatch with fp32 accumulation; 4: int8 activations, which on GPUs with subgroups "
                       "costs two dispatches per MatMulNBits and no decode fusions (BENCHMARKS.md)")
    exclude: list[str] = Field(default_factory=list, description="fnmatch patterns of MatMul node names left in "
                                                                 "float, e.g. '*lm_head*'")


class Encoder(_Strict):
    # int4 by default: measured +0.3 to +0.4 pt WER on the tiny example (BENCHMARKS.md), 4x smaller encoder
    precision: Literal["fp32", "fp16", "int8", "int4"] = Field(
        "int4", description="encoder weights: fp32, fp16 (the fp32 variant keeps fp32), int8 or int4 "
                            "(MatMulNBits); int4 costs +0.3 to +0.4 points of WER on the tiny example for a "
                            "4x smaller encoder (BENCHMARKS.md)")
    # = webbuild.reference.mel.DEFAULT_LEAD_MS, the training recipe's (tests/test_config.py keeps them equal)
    lead_ms: int = Field(
        300, ge=0, le=1000,
        description="milliseconds of pause the mel front-end puts before every chunk's audio, in the encoder "
                    "graph (the browser and the Python reference alike): fixed white noise at the level of the "
                    "chunk's quietest 10 ms. A first word that starts at the chunk's first sample is otherwise "
                    "garbled by a model that learnt speech after a pause (issue 17); 0 gives the upstream "
                    "front-end's features exactly. Applies to a source encoder that takes `mel`; one taking "
                    "`pcm` keeps its own front-end")


class Chunking(_Strict):
    # = webbuild.reference.chunk.ChunkPolicy's defaults; the rest of the policy is fixed there
    max_seconds: float = Field(30.0, gt=0, le=120,
                               description="no chunk of long audio is longer (the page and `webbuild transcribe` "
                                           "cut at pauses, webbuild/reference/chunk.py)")
    join_seconds: float | None = Field(
        None, ge=0, description="sentences separated by pauses travel together in one chunk up to this length; "
                                "0: every pause ends a chunk (a model trained on single sentences); default "
                                "max_seconds")


class Shard(_Strict):
    max_bytes: int = Field(DEFAULT_SHARD_BYTES, ge=1024 * 1024,
                           description="largest file written to dist/, in bytes; the default, 25 MiB, is "
                                       "Cloudflare Pages' limit per file")


class Sample(_Strict):
    audio: Path = Field(description="WAV file, relative to model.yaml")
    text: str = Field(min_length=1, description="its expected transcript")
    language: str | None = Field(None, description="the language it speaks, one of `languages`: `webbuild verify` "
                                                   "forces it on this sample (tokens and text against the "
                                                   "reference); unset: the sample is forced to `language` (or "
                                                   "the first of `languages`) with its text not judged")


class Theme(_Strict):
    accent: str = Field("#2b6cb0", description="buttons, focus rings and the progress bar, as #rrggbb")
    background: str = Field("#ffffff", description="page background, as #rrggbb")
    text: str = Field("#1a202c", description="text colour, as #rrggbb")

    @field_validator("accent", "background", "text")
    @classmethod
    def _colour(cls, v: str) -> str:
        if not re.fullmatch(r"#[0-9a-fA-F]{6}", v):
            raise ValueError(f"expected a colour like '#2b6cb0', got {v!r}")
        return v


class Site(_Strict):
    title: str | None = Field(None, description="page title; unset: the model's name")
    base_path: str = Field("/", description="URL path the site is served under, starting and ending with '/', "
                                            "e.g. /my-repo/ for a project page")
    theme: Theme = Field(Theme(), description="the page's colours")
    samples: list[Sample] = Field(default_factory=list,
                                  description="sample clips on the page, checked by the build (token agreement "
                                              "with the source) and by `webbuild verify`")
    isolation_worker: bool = Field(True, description="ship a service worker of the site's own (isolation-sw.js) "
                                                     "that makes the page cross-origin isolated where the host "
                                                     "sends no COOP/COEP headers (GitHub Pages), so that the wasm "
                                                     "EP runs threads; the first visit reloads once. Off: such "
                                                     "hosts run 1 thread")
    static: Path | None = Field(None, description="folder of files copied into the site as they are, relative "
                                                  "to model.yaml: what a host reads beside the site (CNAME, "
                                                  ".nojekyll, _redirects, robots.txt); a file the build writes "
                                                  "itself may not be among them. Files put into the output "
                                                  "folder by hand are kept by a rebuild too, but a CI job "
                                                  "builds into a new folder every time")

    @field_validator("base_path")
    @classmethod
    def _base(cls, v: str) -> str:
        if not (v.startswith("/") and v.endswith("/")):
            raise ValueError(f"expected a path that starts and ends with '/', e.g. '/my-repo/', got {v!r}")
        return v


PROVIDERS = ("webgpu", "wasm")  # the page's execution providers (its ?ep=), as `webbuild verify` reports them


class DecodeFloor(_Strict):
    webgpu: float | None = Field(None, gt=0, description="floor on WebGPU; null: none")
    wasm: float | None = Field(None, gt=0, description="floor on wasm (WebAssembly on the CPU); null: none")


class Verify(_Strict):
    max_wer: float = Field(0.0, ge=0.0, description="word error rate allowed per sample in `webbuild verify` "
                                                    "and in the build's own check, which warns above it "
                                                    "(a fraction; insertions can take it above 1)")
    build_fails_on_wer: bool = Field(False, description="stop the build (exit code 1) when a sample's WER in its "
                                                        "own check is above max_wer, instead of warning; "
                                                        "`webbuild model.yaml --fail-on-wer` sets it")
    min_decode_tokens_per_s: DecodeFloor = Field(
        DecodeFloor(), description="decode speed `webbuild verify` requires, in tokens/s over all clips that ran on a "
                                   "provider, per provider: `{webgpu: 2, wasm: 20}`, or one number for both; "
                                   "`--min-decode-tokens-per-s` overrides it. Speeds depend on the machine "
                                   "verify runs on, so set floors for the one that runs it (e.g. your CI's)",
        json_schema_extra={"kind": "mapping or number"})

    @field_validator("min_decode_tokens_per_s", mode="before")
    @classmethod
    def _one_floor_for_all(cls, v):
        if v is None:  # `min_decode_tokens_per_s:` left empty: no floor
            return {}
        if isinstance(v, bool) or not isinstance(v, int | float | dict | DecodeFloor):
            raise ValueError("expected tokens/s as a number (every provider) or a mapping such as "
                             "{webgpu: 2, wasm: 20}")
        if isinstance(v, int | float):
            if v <= 0:
                raise ValueError("expected a floor > 0 tokens/s (leave the key out for none)")
            return dict.fromkeys(PROVIDERS, v)
        return v

    def decode_floors(self) -> dict[str, float]:
        """{provider: tokens/s} of the providers with a floor."""
        return {ep: v for ep in PROVIDERS if (v := getattr(self.min_decode_tokens_per_s, ep)) is not None}


class Adapter(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$",
                      description="the adapter's id (the page's picker, the manifest): lower-case letters, "
                                  "digits, . _ -")
    path: Path = Field(description="PEFT-style LoRA folder (adapter_config.json, adapter_model.safetensors) of "
                                   "rank 32 on the decoder's q, k, v, o, gate, up and down projections, relative to "
                                   "model.yaml; `python -m webbuild.train.adapt train` makes one")
    scale: float = Field(1.0, gt=0, description="multiplies the adapter's update, on top of its lora_alpha / r "
                                                "(lora_alpha / sqrt(r) with use_rslora)")
    precision: Literal["int8", "fp16", "fp32"] = Field(
        "int8", description="how the adapter's weights ship: int8 (symmetric, block 32, the 8-bit MatMulNBits "
                            "layout), fp16 or fp32")
    description: str | None = Field(
        None, min_length=1, max_length=200,
        description="what the adapter is for, in one plain sentence the page shows under its picker (e.g. "
                    "\"Tuned for espeak-ng's Klatt voice.\"); unset: the page shows the adapter's name only")


class BuildConfig(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$", description="model id: lower-case letters, digits, . _ -")
    source: Source = Field(description="the ONNX export to build from")
    output: Path = Field(Path("dist"), description="output folder, relative to model.yaml (`-o` overrides)")
    variants: list[Literal["fp16", "fp32"]] = Field(
        default_factory=lambda: list[Literal["fp16", "fp32"]](["fp16", "fp32"]), min_length=1,
        description="precision variants to emit; the page runs fp16 only on adapters with shader-f16, else fp32")
    fusion: Fusion = Field(Fusion(), description="operator fusion (webbuild.fusion)")
    quantize: Quantize = Field(Quantize(), description="int4/int8 MatMulNBits weights (webbuild.quantize)")
    encoder: Encoder = Field(Encoder(), description="the audio encoder's precision and its mel front-end's lead")
    chunking: Chunking = Field(Chunking(), description="how long audio is cut into chunks, in the page and in "
                                                       "`webbuild transcribe` alike (runtime.json `chunking`)")
    speech_detection: bool = Field(
        True, description="decide what is speech with Silero VAD (its ONNX model, about 2.3 MB, ships in the site): "
                          "files and live capture transcribe only speech, so silence, noise and music give no text "
                          "(runtime.json `vad`; webbuild/reference/vad.py); false: every chunk is transcribed")
    shard: Shard = Field(Shard(), description="content-hashed shards under dist/model/")
    site: Site = Field(Site(), description="the page")
    verify: Verify = Field(Verify(), description="bounds for `webbuild verify`")
    adapters: list[Adapter] = Field(
        default_factory=list, description="LoRA adapters to ship beside the base model, each switchable at run "
                                          "time on the page (docs/adapters.md); checked against the source's "
                                          "config.json when model.yaml loads, each packed as its own file")
    languages: list[str] = Field(
        default_factory=lambda: ["English"], min_length=1,
        description="the languages the model transcribes, by the name its answers give them (`language "
                    "<Name><asr_text>...`, e.g. English, Chinese, German): the page's language picker and "
                    "`webbuild transcribe --language` force one; each one's answer prefix is pre-tokenised into "
                    "runtime.json `prompt.languages`")
    language: str = Field("auto", description="the language the page's picker starts on: `auto` (the model names "
                                              "the language it heard) or one of `languages`")
    context: str = Field("", max_length=2000,
                         description="context text (names, terms) the model reads in its prompt's system message, "
                                     "as Qwen3-ASR does, to bias the transcript toward them: the page's context "
                                     "field starts with it and `webbuild transcribe` on the built site uses it "
                                     "unless given --context; at most the tokens runtime.json "
                                     "`prompt.context.max_tokens` allows (the build says); empty: none")
    config_path: Path | None = Field(None, exclude=True)

    @field_validator("languages")
    @classmethod
    def _language_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not re.fullmatch(LANGUAGE_NAME, name):
                raise ValueError(f"language name {name!r} is not a name like 'English' (a capital, then letters); "
                                 "write it as the model's answers do")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"language {twice[0]!r} is listed twice; list each once")
        return names

    @field_validator("language")
    @classmethod
    def _default_language(cls, language: str, info: ValidationInfo) -> str:
        languages = info.data.get("languages")  # absent where languages failed its own check
        if languages is not None and language != AUTO and language not in languages:
            raise ValueError(f"{language!r} is not among languages ({', '.join(languages)}); set it to {AUTO!r} "
                             "or one of them")
        return language

    @model_validator(mode="after")
    def _sample_languages(self) -> BuildConfig:
        for i, sample in enumerate(self.site.samples):
            if sample.language is not None and sample.language not in self.languages:
                raise ValueError(f"site.samples[{i}].language {sample.language!r} is not among languages "
                                 f"({', '.join(self.languages)}); add it there or write one of them")
        return self

    @field_validator("adapters")
    @classmethod
    def _unique_adapter_names(cls, adapters: list[Adapter]) -> list[Adapter]:
        names = [a.name for a in adapters]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"adapter name {twice[0]!r} is used twice; each adapter needs its own name")
        return adapters

    @property
    def title(self) -> str:
        return self.site.title or self.name


def load_config(path: Path) -> BuildConfig:
    """Parse and validate `path`; relative paths are resolved against its folder."""
    path = Path(path)
    raw = _read_yaml(path)
    try:
        cfg = BuildConfig.model_validate(raw)
    except ValidationError as exc:
        # a check across fields (a model validator) names its fields itself and has no input to quote
        raise ConfigError([f"{path}: {_loc(e['loc'])}: {_message(e)}" if e["loc"] else
                           f"{path}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors()]) from None
    cfg = _resolve_paths(cfg, path.parent.resolve())
    problems = _check_files(cfg, path)
    if problems:
        raise ConfigError(problems)
    return cfg.model_copy(update={"config_path": path.resolve()})


def _a_folder(path: Path) -> str:
    """What to give instead of folder `path` where a model.yaml is asked for: the one inside it, `webbuild init`
    for an export, `webbuild serve` for a built site."""
    yamls = [path / "model.yaml"] if (path / "model.yaml").is_file() else sorted(
        p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    if len(yamls) == 1:
        return f"{path} is a folder, not a model.yaml; pass the one inside it: webbuild {yamls[0]}"
    if yamls:
        return f"{path} is a folder, not a model.yaml; pass one of {', '.join(p.name for p in yamls[:4])} inside it"
    if (layout := layouts.detect(path)) is not None:
        return (f"{path} is a folder holding an export (layout {layout.name}), not a model.yaml; write one for it "
                f"with `webbuild init {path}`, then build that")
    if (path / "model" / "manifest.json").is_file():
        return f"{path} is a built site, not a model.yaml; preview it with `webbuild serve {path}`"
    return (f"{path} is a folder, not a model.yaml; pass the path of a model.yaml (`webbuild init EXPORT_FOLDER` "
            "writes one)")


def _yaml_where(exc: yaml.YAMLError) -> str:
    """Where and what of a YAML error, one line (its own text spans lines and quotes the text with a caret)."""
    mark = getattr(exc, "problem_mark", None)
    what = " ".join(str(part) for part in (getattr(exc, "context", None), getattr(exc, "problem", None)) if part)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{where}: {what or exc}".replace("\n", " ")


def _read_yaml(path: Path) -> dict:
    if path.is_dir():
        raise ConfigError([_a_folder(path)])
    if not path.is_file():
        raise ConfigError([f"{path}: no such file; pass the path of a model.yaml"])
    try:
        raw = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{path}: not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x}); "
                           "save it as UTF-8"]) from None
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read it ({exc.strerror})"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML{_yaml_where(exc)}"]) from None
    if not isinstance(raw, dict):
        raise ConfigError([f"{path}: expected a mapping at the top level (name:, source:, ...)"])
    return raw


def _loc(loc: tuple) -> str:
    return ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in loc).replace(".[", "[") or "(top)"


def _message(err: ErrorDetails) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        return "unknown key; remove it or check its spelling (see docs/model-yaml.md)"
    if kind == "missing":
        return "required key is missing"
    if kind == "literal_error":
        return f"expected one of {err['ctx']['expected']}; got {err['input']!r}"
    if kind == "string_pattern_mismatch":
        return f"got {err['input']!r}; expected lower-case letters, digits, '.', '_' or '-'"
    msg = err["msg"].removeprefix("Value error, ")  # pydantic's prefix to a validator's own message
    got = f"got {err['input']!r}" if "input" in err else ""
    return f"{msg}; {got}" if got and got not in msg else msg  # a validator's own message may say it already


def _resolve_paths(cfg: BuildConfig, root: Path) -> BuildConfig:
    source = cfg.source.model_copy(update={"dir": (root / cfg.source.dir).resolve()})
    samples = [s.model_copy(update={"audio": (root / s.audio).resolve()}) for s in cfg.site.samples]
    static = (root / cfg.site.static).resolve() if cfg.site.static is not None else None
    site = cfg.site.model_copy(update={"samples": samples, "static": static})
    adapters = [a.model_copy(update={"path": (root / a.path).resolve()}) for a in cfg.adapters]
    return cfg.model_copy(update={"source": source, "site": site, "output": (root / cfg.output).resolve(),
                                  "adapters": adapters})


def _check_files(cfg: BuildConfig, path: Path) -> list[str]:
    src = cfg.source
    if not src.dir.is_dir():
        return [f"{path}: source.dir: folder {src.dir} does not exist; point it at the source export"]
    problems = [
        f"{path}: source.dir: {src.dir} lacks {name}, which layout {src.layout!r} needs"
        for name in layouts.layout(src.layout).files if not (src.dir / name).is_file()
    ]
    found = layouts.detect(src.dir)
    if problems and found is not None and found.name != layouts.layout(src.layout).name:
        problems = [f"{path}: source.layout: {src.layout!r}, but {src.dir} holds an export of layout {found.name!r} "
                    f"(its {found.prefill}); set source.layout: {found.name}"]
    problems += [
        f"{path}: site.samples[{i}].audio: file {s.audio} does not exist"
        for i, s in enumerate(cfg.site.samples) if not s.audio.is_file()
    ]
    if cfg.site.static is not None and not cfg.site.static.is_dir():
        what = "is a file, not a folder" if cfg.site.static.exists() else "does not exist"
        problems.append(f"{path}: site.static: {cfg.site.static} {what}; point it at a folder of files to copy "
                        "into the site (CNAME, .nojekyll)")
    return problems or _check_adapters(cfg, path)  # adapters are checked against a source that is there


def _check_adapters(cfg: BuildConfig, path: Path) -> list[str]:
    """Each adapter against the source's decoder (its config.json): one line per problem, naming the
    adapter and the tensor."""
    if not cfg.adapters:
        return []
    try:
        base = json.loads((cfg.source.dir / "config.json").read_bytes())
    except ValueError:  # the build's source stage says what is wrong with it (webbuild.reference.source_files)
        return []
    problems = []
    for i, adapter in enumerate(cfg.adapters):
        where = f"{path}: adapters[{i}] ({adapter.name})"
        if not adapter.path.is_dir():
            problems.append(f"{where}: folder {adapter.path} does not exist")
            continue
        problems += [f"{where}: {problem}" for problem in adapter_problems(adapter.path, base)]
    return problems

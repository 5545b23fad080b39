"""The `webbuild` command line: `webbuild model.yaml` builds a site; subcommands run single stages.

Bad input raises a webbuild.errors.WebbuildError, which click prints as `error: ...` (exit code 2); any
other exception is a bug and shows its traceback. Progress is logged (logging.getLogger(__name__) in
every module) and printed by one handler as `[  12.3s] message` lines on stderr.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import sys
import time
from pathlib import Path

import click

from webbuild import DISTRIBUTION, layouts
from webbuild.config import PROVIDERS, Encoder, Quantize
from webbuild.errors import AudioError, BenchError, CommandError, ZooError
from webbuild.text import plural
from webbuild.tools.bench import DECODE_FORMS, WARM_UPS
from webbuild.tools.scaffold import WORKFLOWS

log = logging.getLogger(__name__)


class Finite(click.FloatRange):
    """A float option within its range, and a number: click's FloatRange lets nan through (every comparison
    with it is false)."""

    def convert(self, value, param, ctx) -> float:
        number = super().convert(value, param, ctx)
        if number != number or number in (float("inf"), float("-inf")):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class ProgressHandler(logging.Handler):
    """`[  12.3s] message` on stderr, seconds since the command started; warnings and errors say so.

    It sits on the root logger: third-party warnings print the same way, and onnxruntime's import-time
    logging.basicConfig finds logging configured and adds no handler of its own (whose INFO lines from
    onnxscript's passes would flood the output)."""

    def __init__(self):
        super().__init__()
        self.start = time.monotonic()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
            click.echo(f"[{time.monotonic() - self.start:6.1f}s] {level}{record.getMessage()}", err=True)
        except Exception:
            self.handleError(record)


def _log_progress(ctx, param, verbose: bool) -> None:
    """The group's -v: print webbuild's progress (INFO; DEBUG with -v) and others' warnings on stderr."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, ProgressHandler)]:
        root.removeHandler(old)  # an earlier invocation in this process (tests)
    root.addHandler(ProgressHandler())
    root.setLevel(logging.WARNING)
    logging.getLogger("webbuild").setLevel(logging.DEBUG if verbose else logging.INFO)


def _debug(ctx, param, verbose: bool) -> None:
    """A command's own -v (`webbuild model.yaml -v`)."""
    if verbose:
        logging.getLogger("webbuild").setLevel(logging.DEBUG)


def verbose_option(callback):
    return click.option("-v", "--verbose", is_flag=True, expose_value=False, callback=callback,
                        help="Print debug lines too (what each step does).")


def _quantize_defaults(command):
    """Fill {bits}, {block_size}, {accuracy_level} in a command's help from model.yaml's defaults (config.Quantize)."""
    command.__doc__ = command.__doc__.format(**Quantize().model_dump())
    return command


class BuildGroup(click.Group):
    """`webbuild model.yaml ...` is short for `webbuild build model.yaml ...`."""

    def parse_args(self, ctx, args):
        first = next((i for i, arg in enumerate(args) if not arg.startswith("-")), None)
        if first is not None and args[first] not in self.commands:
            self._check_not_a_typo(args[first])
            args = [*args[:first], "build", *args[first:]]
        return super().parse_args(ctx, args)

    def _check_not_a_typo(self, arg: str) -> None:
        """`webbuild servee dist` is a mistyped command, not a model.yaml to build: a word that names no
        file and has neither a .yaml/.yml suffix nor a folder in it gets click's "Did you mean" instead
        of build's "model.yaml not found"."""
        if Path(arg).exists() or Path(arg).suffix in (".yaml", ".yml") or "/" in arg or os.sep in arg:
            return
        close = difflib.get_close_matches(arg, self.commands, n=1)
        if close:
            raise CommandError(f"no such command '{arg}'; did you mean '{close[0]}'?")
        raise CommandError(f"'{arg}' is neither a command ({', '.join(self.commands)}) nor a model.yaml file")


@click.group(cls=BuildGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name=DISTRIBUTION)
@verbose_option(_log_progress)
def main():
    """Build a Qwen3-ASR ONNX export into a static speech-recognition website.

    \b
    Example:
      webbuild examples/tiny-asr/model.yaml          # build the site into dist/
      webbuild examples/tiny-asr/model.yaml -o out   # ... into out/
      webbuild serve dist                            # preview it locally
    """


@main.command()
@verbose_option(_debug)
@click.argument("config", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="Output folder (default: model.yaml's `output`, dist/).")
@click.option("--fail-on-wer", is_flag=True,
              help="Exit with code 1 when a sample's WER in the build's check is above verify.max_wer (default: "
                   "a warning; model.yaml verify.build_fails_on_wer).")
def build(config: Path, output: Path | None, fail_on_wer: bool):
    """Build the site described by CONFIG (a model.yaml) into dist/.

    \b
    Example:
      webbuild build examples/tiny-asr/model.yaml -o dist
    """
    from webbuild.config import load_config

    cfg = load_config(config)  # before the pipeline's imports (onnx, onnx-ir: a second): a bad model.yaml fails at once
    from webbuild.pipeline.runner import run_build

    if fail_on_wer:
        cfg = cfg.model_copy(update={"verify": cfg.verify.model_copy(update={"build_fails_on_wer": True})})
    click.echo(run_build(cfg, output or cfg.output).table())


@main.command()
@verbose_option(_debug)
@click.argument("source", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("model.yaml"), show_default=True,
              help="The model.yaml to write; its folder is the one paths in it are relative to, and the "
                   "repository root of --workflow's file.")
@click.option("--name", help="Model id (default: SOURCE's folder name in lower case).")
@click.option("--samples", "samples", multiple=True, type=click.Path(path_type=Path),
              help="A WAV, or a folder of WAVs, with a same-named .txt transcript each: the page's sample clips "
                   "(repeatable).")
@click.option("--workflow", type=click.Choice(WORKFLOWS),
              help="Also write a CI workflow: pages = .github/workflows/pages.yml beside model.yaml (build, "
                   "webbuild verify with a JUnit report, deploy to GitHub Pages).")
@click.option("--webbuild", "webbuild_spec", metavar="REQUIREMENT",
              help=f"How the workflow installs webbuild: a pip requirement with the verify extra (a version, a git "
                   f"URL, a wheel in the repository); default: {DISTRIBUTION}[verify]==VERSION, this webbuild's "
                   "version.")
@click.option("--force", is_flag=True, help="Overwrite an existing model.yaml (and workflow).")
def init(source: Path, output: Path, name: str | None, samples: tuple[Path, ...], workflow: str | None,
         webbuild_spec: str | None, force: bool):
    """Write a commented model.yaml for the export in SOURCE: its layout told by its files, its name
    from the folder, the page's samples from --samples, every other section at its default (as comments).

    The file is checked as a build would read it before it is written; a folder that is no export, or an
    existing model.yaml (without --force), is a one-line error and nothing is written.

    \b
    Examples:
      webbuild init my-export                          # ./model.yaml for the export in my-export/
      webbuild init my-export --samples clips/ --workflow pages
      webbuild model.yaml                              # then build it
    """
    from webbuild.tools.scaffold import init as write

    for path in write(source, output, name=name, samples=samples, workflow=workflow, webbuild=webbuild_spec,
                      force=force):
        click.echo(f"wrote {path}")
    click.echo(f"build it: webbuild {output}")


@main.command()
@verbose_option(_debug)
@click.argument("preset")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="Folder to create (must not exist).")
@click.option("--layout", type=click.Choice([name for entry in layouts.ZOO_LAYOUTS
                                            for name in (entry.name, *entry.aliases)]),
              default=layouts.SPLIT.name, show_default=True,
              help="; ".join(f"{entry.name}: {entry.summary}" for entry in layouts.ZOO_LAYOUTS)
              + f" (old spellings, deprecated: {layouts.aliases_text()})")
@click.option("--exporter", type=click.Choice(["torchscript", "dynamo"]), default="torchscript", show_default=True,
              help="torch.onnx path; they decompose operators differently.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random weights.")
@click.option("--hf-dir", type=click.Path(path_type=Path),
              help="Also save the text decoder as a Hugging Face Qwen3ForCausalLM folder.")
def zoo(preset: str, output: Path, layout: str, exporter: str, seed: int, hf_dir: Path | None):
    """Make a Qwen3-ASR source export: PRESET (tiny, 0.6b, 1.7b) with random weights,
    or a trained checkpoint folder (save_pretrained + tokenizer.json).

    The export is checked against the torch model with onnxruntime before it is written.

    \b
    Examples:
      webbuild zoo tiny -o /tmp/tiny                       # a few MB, seconds
      webbuild zoo 0.6b -o /tmp/q06 --hf-dir /tmp/q06-hf   # published 0.6B dimensions
      webbuild zoo tiny -o /tmp/tm --layout merged --exporter dynamo
      python -m webbuild.zoo.export_v2 /tmp/tiny /tmp/tiny-v2  # a split export in layout qwen3-asr-v2
    """
    from webbuild.zoo.build import load_checkpoint, random_model, save_text_decoder_hf
    from webbuild.zoo.export import check_new_folder, export_model
    from webbuild.zoo.presets import PRESET_NAMES

    check_new_folder(output)  # before the model is made, which takes a while for the large presets
    if preset in PRESET_NAMES:
        log.info(f"building preset {preset} (seed {seed})")
        model, tok = random_model(preset, seed)
    elif Path(preset).is_dir():
        log.info(f"loading checkpoint {preset}")
        model, tok = load_checkpoint(Path(preset))
    else:
        raise ZooError(f"{preset!r} is neither a preset ({', '.join(PRESET_NAMES)}) nor a checkpoint folder")
    export_model(model, tok, output, layouts.layout(layout, "--layout").name, exporter)
    if hf_dir:
        save_text_decoder_hf(model, tok, hf_dir)
        log.info(f"wrote {hf_dir}")


@main.command()
@verbose_option(_debug)
@click.argument("model", type=click.Path(path_type=Path))
@click.argument("audio", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per line: {\"audio\": path, \"text\": ..., \"language\": ..., \"context\": ...}.")
@click.option("--max-new-tokens", type=click.IntRange(1), default=200, show_default=True,
              help="Stop a clip's greedy decoding after this many tokens (end of text stops it sooner).")
@click.option("--variant", help="Precision variant of a built site (fp32, fp16; default fp32): one of its manifest's "
                                 "variants; a source export has none.")
@click.option("--lead-ms", type=click.IntRange(0, 1000), default=Encoder.model_fields["lead_ms"].default,
              show_default=True,
              help="Silence put before each clip by the mel front-end of a source export whose encoder takes mel "
                   "(model.yaml encoder.lead_ms; 0: the upstream features). A built site's graph has its own.")
@click.option("--adapter", default=None, metavar="NAME",
              help="A built site's LoRA adapter (model.yaml adapters: name) to transcribe with; "
                   "default: the base model.")
@click.option("--language", default=None, metavar="NAME",
              help="Force the answer's language (one of a built site's model.yaml languages, e.g. English): "
                   "decoding starts after `language NAME<asr_text>`; default: the model names the language it "
                   "hears (--json gives it as \"language\").")
@click.option("--context", default=None, metavar="TEXT",
              help="Context text (names, terms) put in the prompt's system message, as Qwen3-ASR reads it, to "
                   "bias the transcript toward them; '' for none; default: a built site's model.yaml context, "
                   "else none (--json gives it as \"context\"). At most the tokens the prompt has room for "
                   "(a built site's runtime.json prompt.context.max_tokens).")
@click.option("--max-chunk-seconds", type=Finite(1, 120), default=None,
              help="Cut long audio into chunks at most this long (default: a built site's model.yaml "
                   "chunking.max_seconds, else 30).")
@click.option("--join-seconds", type=Finite(0), default=None,
              help="Sentences between pauses share a chunk up to this length; 0: every pause ends a chunk "
                   "(default: a built site's model.yaml chunking.join_seconds, else the chunk length).")
@click.option("--live", is_flag=True,
              help="Cut the audio as the page's live mode cuts a microphone's frames (runtime.json "
                   "chunking_live: every pause ends a chunk as soon as it is heard); with --json each line "
                   "lists the chunks: start and end (16 kHz samples), tokens and text, the page's final text.")
def transcribe(model: Path, audio: tuple[Path, ...], as_json: bool, max_new_tokens: int, variant: str | None,
               lead_ms: int, adapter: str | None, language: str | None, context: str | None,
               max_chunk_seconds: float | None, join_seconds: float | None, live: bool):
    """Transcribe WAV files with MODEL on onnxruntime CPU: a source export folder of any layout (its
    files tell which) or a built site (dist/; its own graphs, reassembled from the shards).

    AUDIO are WAV files or folders of them. WAV of any sample rate and channel count is resampled
    to 16 kHz mono (webbuild/reference/resample.py, the page's resampler too); long audio is cut at
    pauses as the page cuts it (a built site's runtime.json `chunking`, else the default policy;
    --max-chunk-seconds and --join-seconds override it), read as it is transcribed; decoding is greedy.
    A malformed file (truncated, NaN or infinite samples, no samples, an absurd rate) stops with one
    line naming it (exit code 2). Where a clip has a same-named .txt transcript beside it,
    its word error rate is reported too (and a total at the end, on stderr).

    \b
    Examples:
      webbuild transcribe examples/tiny-asr/model examples/tiny-asr/samples/*.wav --json
      webbuild transcribe examples/tiny-asr/model /tmp/heldout    # folder of .wav + .txt
      webbuild transcribe dist /tmp/heldout --variant fp16        # a built site's fp16 graphs
      webbuild transcribe dist /tmp/klatt --adapter klatt         # with the site's LoRA adapter on
      webbuild transcribe dist clip.wav --language English --json # the language forced
      webbuild transcribe dist clip.wav --context "Zorbak, Quill"  # names the model should expect
      webbuild transcribe dist joined.wav --live --json           # the page's live chunks and final texts
    """
    from webbuild.errors import SourceError
    from webbuild.reference.mel import lead_samples
    from webbuild.reference.transcribe import load_transcriber
    from webbuild.reference.wav import wav_info
    from webbuild.reference.wer import corpus_wer, wer

    paths = _wav_paths(audio)
    for path in paths:  # every header checked before the model loads; samples are checked as they are read
        wav_info(path)
    runner = load_transcriber(model, variant, lead=lead_samples(lead_ms), adapter=adapter)
    runner.policy = runner.policy.override(max_chunk_seconds, join_seconds)
    runner.live_policy = runner.live_policy.override(max_chunk_seconds)
    runner.force_language(language)
    if context is not None:
        try:
            runner.give_context(context)
        except SourceError as exc:
            raise SourceError(f"--context: {exc}") from None
    pairs = []
    for path in paths:
        row: dict = {"audio": str(path)}
        if live:
            chunks = runner.decode_live(path, max_new_tokens)
            row["text"] = runner.file_text([c.decoded for c in chunks])
            row["language"] = runner.file_language([c.decoded for c in chunks])
            if as_json:
                row["chunks"] = [{"start": c.start, "end": c.end, "tokens": c.decoded.tokens,
                                  "text": runner.text(c.decoded.tokens)} for c in chunks]
        else:
            decoded = runner.decode_file(path, max_new_tokens)
            row["text"] = runner.file_text(decoded)
            row["language"] = runner.file_language(decoded)
        expected = path.with_suffix(".txt")
        if expected.is_file():
            row["expected"] = expected.read_text().strip()
            row["wer"] = round(wer(row["expected"], row["text"]), 4)
            pairs.append((row["expected"], row["text"]))
        plain = (str(v) for k, v in row.items() if k != "language")  # columns: audio, text, expected, WER
        click.echo(json.dumps({**row, "context": runner.context}) if as_json else "\t".join(plain))
    if pairs:
        click.echo(f"WER {100 * corpus_wer(pairs):.2f}% over {plural(len(pairs), 'clip')}", err=True)


def _wav_paths(paths: tuple[Path, ...]) -> list[Path]:
    """Files as given; folders expand to their *.wav files in name order."""
    out = []
    for p in paths:
        if p.is_dir():
            wavs = sorted(p.glob("*.wav"))
            if not wavs:
                raise AudioError(f"{p}: folder holds no .wav files")
            out += wavs
        else:
            out.append(p)
    return out


@main.command()
@verbose_option(_debug)
@_quantize_defaults
@click.argument("src", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="Folder for decoder.onnx(.data) and encoder.onnx(.data): new, empty or an earlier fuse output, "
                   "replaced in one step at the end (other files in it are kept).")
@click.option("--report", type=click.Path(path_type=Path), help="Write the op census (before/after) as JSON.")
@click.option("--no-quantize", is_flag=True,
              help="Fuse only: float weights, and the graph keeps its inputs_embeds input.")
@click.option("--strict", is_flag=True,
              help="Exit with code 1 when an attention or a norm is left unfused (the files are still written).")
def fuse(src: Path, output: Path, report: Path | None, no_quantize: bool, strict: bool):
    """Rebuild fused operators (GroupQueryAttention, RMSNorm, packed QKV) in a decoder, then quantize.

    SRC is a source export folder of any layout (its files tell which) or a decoder .onnx file. The
    quantization is the build's default: int{bits} MatMulNBits (symmetric, block {block_size}, accuracy
    level {accuracy_level}) and the embeddings as an int4 lookup (GatherBlockQuantized, sharing
    lm_head's weight when tied), so the graph takes input_ids, audio_features and audio_offset instead
    of inputs_embeds (config.json and embed_tokens.bin are read from the source's folder). Writes
    OUTPUT/decoder.onnx(.data). The encoder.onnx beside it, if any, is fused too (LayerNorm /
    SkipLayerNorm, Gelu / BiasGelu, MultiHeadAttention; float weights) into OUTPUT/encoder.onnx,
    reported as a second graph. Prints the op table of each graph (op, nodes before -> after), then
    every pattern a rule left alone: which rule, where and why.

    \b
    Example:
      webbuild fuse examples/tiny-asr/model -o /tmp/fused --report /tmp/fuse.json
      webbuild fuse examples/tiny-asr/model -o /tmp/fused-fp32 --no-quantize
    """
    from webbuild.pipeline.fuse import check_strict, fuse_command, summary

    rep = fuse_command(src, output, report, quantize=not no_quantize)
    for graph in (rep, rep.get("encoder")):
        if graph:
            log.info(f"wrote {graph['output']}")
    for line in summary(rep):
        click.echo(line)
    if strict:
        check_strict(rep, "--strict", with_summary=False)


@main.command()
@verbose_option(_debug)
@click.argument("dir", type=click.Path(path_type=Path))
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="Port to listen on (0: any free one, printed at start).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on; loopback keeps it private.")
@click.option("--base-path", default="/", show_default=True,
              help="Serve the site under this path, like model.yaml's site.base_path.")
@click.option("--coop-coep", is_flag=True,
              help="Send COOP/COEP (cross-origin isolation: wasm threads) even where _headers does not.")
@click.option("--no-isolation-headers", "isolation_headers", is_flag=True, flag_value=False, default=True,
              help="Send no COOP/COEP, not even _headers' (as GitHub Pages serves a site): the site's isolation "
                   "service worker's case.")
def serve(dir: Path, port: int, host: str, base_path: str, coop_coep: bool, isolation_headers: bool):
    """Preview a built site on http://127.0.0.1:PORT/ (loopback only unless --host says otherwise).

    Only files inside DIR are served (no `..` or symlink escapes); the site's `_headers` file
    is applied, as Netlify and Cloudflare Pages do.

    \b
    Example:
      webbuild serve dist
      webbuild serve dist --base-path /my-repo/ --port 8080
      webbuild serve dist --no-isolation-headers   # as GitHub Pages: the service worker isolates the page
    """
    from webbuild.tools.serve import serve_forever

    serve_forever(dir, host, port, base_path=base_path, coop_coep=coop_coep, isolation_headers=isolation_headers)


class DecodeFloor(click.ParamType):
    """`N` (every provider) or `PROVIDER=N`: a decode tokens/s floor for `webbuild verify`."""

    name = "[PROVIDER=]N"

    def convert(self, value, param, ctx) -> tuple[str | None, float]:
        if isinstance(value, tuple):
            return value
        ep, _, number = value.rpartition("=")
        try:
            floor = float(number)
        except ValueError:
            floor = float("nan")
        if (ep and ep not in PROVIDERS) or not 0 < floor < float("inf"):
            self.fail(f"expected N or PROVIDER=N, N > 0 tokens/s and PROVIDER one of {', '.join(PROVIDERS)} "
                      f"(e.g. 20 or wasm=20); got {value!r}", param, ctx)
        return ep or None, floor


class ClipsEp(click.ParamType):
    """`EP` or `EP:N` (the first N clips only): a provider `webbuild verify` runs the --clips on."""

    name = "EP[:N]"

    def convert(self, value, param, ctx):
        from webbuild.tools.verify.visits import ClipsRun

        if isinstance(value, ClipsRun):
            return value
        ep, _, count = value.partition(":")
        if ep not in ("auto", *PROVIDERS) or (count and not (count.isdigit() and int(count) > 0)):
            self.fail(f"expected EP or EP:N, EP one of auto, {', '.join(PROVIDERS)} and N > 0 clips "
                      f"(e.g. wasm or webgpu:5); got {value!r}", param, ctx)
        return ClipsRun(ep, int(count) if count else None)


@main.command()
@verbose_option(_debug)
@click.argument("target")
@click.option("--clips", type=click.Path(path_type=Path), help="Folder of *.wav with same-named *.txt transcripts.")
@click.option("--json", "report", type=click.Path(path_type=Path), help="Write the JSON report here.")
@click.option("--junit", type=click.Path(path_type=Path),
              help="Write a JUnit XML report here (a test case per clip and per check), for CI test views.")
@click.option("--browser", help="Chrome/Chromium executable or channel (default: $WEBBUILD_BROWSER, "
              "a system Chrome/Chromium, Playwright's own).")
@click.option("--ep", type=click.Choice(["auto", "webgpu", "wasm"]), default="auto", show_default=True,
              help="Execution provider for the samples (auto: the page's own choice).")
@click.option("--clips-ep", "clips_eps", type=ClipsEp(), multiple=True,
              help="Run --clips on this provider (auto, webgpu, wasm), on a visit of its own (a later one on "
                   "--ep's provider: on the samples' page); EP:N runs the first N clips only; repeatable, a visit "
                   "per provider (default: with the samples).")
@click.option("--clips-max-wer", type=Finite(0, 1),
              help="Bound on the --clips' corpus WER, per provider (default: the site's verify.max_wer).")
@click.option("--clips-max-clip-wer", type=Finite(0, 1),
              help="Bound on each --clips clip's own WER (default: none; the corpus bound judges the set).")
@click.option("--min-decode-tokens-per-s", "floors", type=DecodeFloor(), multiple=True,
              help="Fail when the clips decoded on a provider average fewer tokens/s than N: N for every "
                   "provider, PROVIDER=N (webgpu, wasm) for one; repeatable; replaces the site's "
                   "verify.min_decode_tokens_per_s for the providers it names.")
@click.option("--timeout", type=Finite(0, min_open=True), default=600, show_default=True,
              help="Seconds per load or clip.")
@click.option("--live", type=click.Choice(["on", "off", "only"]), default="on", show_default=True,
              help="The live check: the samples joined with pauses played into the page's Live transcription "
                   "through Chromium's fake microphone, in real time; its delays in the report (`live`) and its "
                   "checks' lines. only: that check alone (measures a site's live delays).")
def verify(target: str, clips: Path | None, report: Path | None, junit: Path | None, browser: str | None, ep: str,
           clips_eps: tuple, clips_max_wer: float | None, clips_max_clip_wer: float | None,
           floors: tuple[tuple[str | None, float], ...], timeout: float, live: str):
    """Check in a real browser that a built site (folder or URL) transcribes correctly and fast.

    Transcribes every sample of the site (and --clips) and compares with the expected text
    (normalised: case and punctuation do not count; model.yaml verify.max_wer bounds the WER) and,
    for a local folder, with the Python reference on the same graphs, token for token: a token may
    differ only where both margins (chosen logit minus runner-up) are under a near-tie bound, and such
    clips are counted as passed under the margin (a MARGIN line each). Also checks that a shard
    corrupted in transit is caught and re-fetched, that a second visit loads from the cache, that the
    site falls back to wasm without WebGPU, that no request leaves the origin and that the console
    shows no errors, and, where model.yaml's verify.min_decode_tokens_per_s or
    --min-decode-tokens-per-s sets a floor for a provider, that the clips decoded on it reach that
    many tokens/s (measured on this machine: set floors for the one that runs verify). The live check
    plays the samples, joined with pauses, into the page's Live transcription (Chromium's fake
    microphone): partial text before each clip ends, finals that never change and, for a folder,
    equal to `webbuild transcribe --live` on the page's capture; its delays (a word's end to its first
    appearance, a pause to the final text) in the report. Exit code 1
    when anything fails, with a FAIL line (its one-line reason) per failed clip and check; --junit
    writes the same as JUnit XML for a CI's test view.

    \b
    Example:
      webbuild verify dist --json verify.json --junit verify.xml
      webbuild verify dist --clips heldout/ --clips-ep wasm --clips-ep webgpu:5
      webbuild verify dist --ep wasm --min-decode-tokens-per-s wasm=50
      webbuild verify https://user.github.io/my-asr/ --browser chrome
      webbuild verify dist --live only --ep webgpu --json live.json   # the live delays alone
    """
    from webbuild.tools.verify.report import failures, per_rate, table, under_margin, verdict, write_json, write_junit
    from webbuild.tools.verify.visits import Options
    from webbuild.tools.verify.visits import verify as run_verify

    overrides = {name: floor for provider, floor in floors for name in ([provider] if provider else PROVIDERS)}
    opts = Options(target, clips, browser, None if ep == "auto" else ep, clips_eps, clips_max_wer,
                   clips_max_clip_wer, timeout, min_decode_tokens_per_s=overrides, live=live)
    result = run_verify(opts)
    click.echo(table(result))
    if report:
        write_json(result, report)
        click.echo(f"report: {report}")
    if junit:
        write_junit(result, junit)
        click.echo(f"JUnit report: {junit}")
    # last: a line per source rate of the clips, the verdict, a line per clip passed under the margin, per failure
    click.echo("\n".join([*per_rate(result), verdict(result), *under_margin(result), *failures(result)]))
    sys.exit(0 if result["ok"] else 1)


@main.command()
@verbose_option(_debug)
@click.argument("dir", type=click.Path(path_type=Path))
@click.option("--runtime", type=click.Choice(["node", "browser"]), default="node", show_default=True,
              help="node: the site's runtime modules under Node; browser: the site's own page in Chromium.")
@click.option("--ep", type=click.Choice(["auto", "webgpu", "wasm"]), default="auto", show_default=True,
              help="Execution provider; auto takes WebGPU on a hardware adapter, else wasm (the page's choice).")
@click.option("--decode-tokens", type=click.IntRange(1), default=128, show_default=True,
              help="Length of the synthetic greedy decode that gives ms/token.")
@click.option("--repeat", type=click.IntRange(1), default=1, show_default=True, help="Timed runs per sample clip.")
@click.option("--max-clips", type=click.IntRange(0), help="Transcribe only the first N sample clips.")
@click.option("--max-new-tokens", type=click.IntRange(1),
              help="Cap each clip's greedy decode at N tokens (default: the site's max_new_tokens; in the browser "
                   "the page's ?max_new_tokens=), e.g. for a large model on wasm.")
@click.option("--swiftshader", is_flag=True, help="WebGPU on Chromium's software Vulkan (correctness, not speed).")
@click.option("--session-config", "session_config", multiple=True, metavar="KEY=VALUE",
              help="An onnxruntime session config entry to try on top of the runtime's own (node only), e.g. "
                   "ep.webgpuexecutionprovider.maxNumPendingDispatches=256; repeatable.")
@click.option("--graph-capture/--no-graph-capture", default=True, show_default=True,
              help="Decode with the captured step graph where WebGPU allows it (node only); off: every step plain.")
@click.option("--decode-forms", "decode_forms", type=click.Choice(DECODE_FORMS), default=DECODE_FORMS[0],
              show_default=True,
              help="auto: the decode form the load chooses (captured where it works, unless measured slower on a "
                   "hardware GPU); both: the clips and the synthetic decode in the captured form, then in plain "
                   "steps, on one load (node only, a built site on WebGPU): the report's own figures are the "
                   "captured form's, its `plain` the plain steps'.")
@click.option("--warm-up", "warm_up", type=click.Choice(WARM_UPS), default=WARM_UPS[0], show_default=True,
              help="The load's warm-up: shapes, every class of shapes a chunk can meet (as the page on a hardware "
                   "GPU); decode, all but the longest chunk's (its encoder run and prompt: most of a software GPU's "
                   "load); second, a second of silence (as the page on a software GPU). The decode's calls per "
                   "token are the same; a first clip of a shape not warmed compiles its own.")
@click.option("--adapter", metavar="NAME",
              help="Switch the site's LoRA adapter NAME on before the clips and the synthetic decode (node: on, off, "
                   "then on again, each switch's WebGPU calls counted; browser: the page's picker); default: the "
                   "base model.")
@click.option("--threads", type=click.IntRange(1, 64),
              help="The wasm EP's threads (browser only: the page's ?threads=; Node runs 1); default: the page's "
                   "rule for this machine's processors (runtime/site.js wasmThreads).")
@click.option("--rounds", type=click.IntRange(1),
              help="Rows alternated in N rounds in Chromium (the GPU machine's comparison): the site's page beside "
                   "a peer's and Node's, WebGPU calls per token and the GPU's clock per round (tools/bench/rounds.py).")
@click.option("--row", "rows", multiple=True, metavar="ROW",
              help="With --rounds, a row (repeatable): chromium-webbuild[:QUERY], chromium-peer, node-webbuild, "
                   "node-peer; default: chromium-webbuild, chromium-peer with --peer, node-webbuild.")
@click.option("--peer", type=click.Path(path_type=Path, exists=True, file_okay=False),
              help="With --rounds: a merged decoder's folder (the onnxruntime-genai builder's output), the peer rows'.")
@click.option("--short-decode", type=click.IntRange(1), default=16, show_default=True,
              help="With --rounds: the short decode whose counts are taken from --decode-tokens' (calls per token).")
@click.option("--prompt-tokens", type=click.IntRange(1), default=41, show_default=True,
              help="With --rounds: the peer's synthetic prompt length.")
@click.option("--timing", is_flag=True,
              help="With --rounds: after them, one decode of each Chromium page cut into phases and GPU kernel times.")
@click.option("--step-trace", type=click.IntRange(0), default=0, metavar="N",
              help="With --rounds: after them, N captured steps timed one by one (3 and 12 in flight, with and "
                   "without a macrotask after each), then N replays alone back to back (no read-back, one "
                   "mapAsync each, each waited for); needs a row decoding captured steps.")
@click.option("--first-use", metavar="SECONDS,...",
              help="A fresh page per clip length (e.g. 1,2.5,5,8,15,30): its load and its first clip's TTFT and "
                   "new GPU pipelines (after --rounds' rows, or alone); --ep wasm runs those pages on wasm.")
@click.option("--one-page", is_flag=True, help="--first-use's lengths in turn on one page instead of one page each.")
@click.option("--first-use-query", default="", metavar="QUERY",
              help="--first-use's pages with QUERY added to their address (e.g. runs=whole).")
@click.option("--allow-software", is_flag=True,
              help="With --rounds or --first-use: go on where WebGPU is a software adapter (a CPU smoke test).")
@click.option("--json", "report", type=click.Path(path_type=Path), help="Write the JSON report here.")
def bench(dir: Path, runtime: str, ep: str, decode_tokens: int, repeat: int, max_clips: int | None,
          max_new_tokens: int | None, swiftshader: bool, session_config: tuple[str, ...], graph_capture: bool,
          decode_forms: str, warm_up: str, adapter: str | None, threads: int | None, rounds: int | None,
          rows: tuple[str, ...], peer: Path | None, short_decode: int, prompt_tokens: int, timing: bool,
          step_trace: int, first_use: str | None, one_page: bool, first_use_query: str, allow_software: bool,
          report: Path | None):
    """Measure load time, encoder time, TTFT, prefill and decode speed of a built site's runtime.

    Runs the site's own runtime modules and onnxruntime-web from DIR under Node (WebGPU through
    Dawn, or the wasm EP): load and warm-up, the sample clips, then a synthetic greedy decode.
    --runtime browser opens the site's own page in Chromium instead, clicks its sample clips, then runs
    the synthetic decode (and counts its WebGPU calls) in the site's worker, from a bench-only copy.
    DIR may also be a split source export (the baseline) or a folder with a merged decoder (a peer
    such as the onnxruntime-genai builder's model.onnx): its graphs then run directly on synthetic
    inputs of the site's shapes (speed only).

    \b
    Example:
      webbuild bench dist --ep wasm --json bench.json
      webbuild bench dist --ep webgpu --swiftshader --decode-tokens 16
      webbuild bench dist --ep webgpu --decode-forms both   # captured and plain steps, one load
      webbuild bench dist --ep webgpu --adapter klatt   # per-token counts with the adapter on
      webbuild bench examples/tiny-asr/model --ep wasm
      webbuild bench dist --runtime browser --ep wasm --threads 4
      webbuild bench dist --rounds 3 --peer genai-out --json rounds.json   # on the GPU machine
      webbuild bench dist --first-use 1,5,30 --allow-software
    """
    from webbuild.tools.bench import gpu_clock, require_adapter, site_adapters, table

    if adapter and (names := site_adapters(dir)) is not None:
        require_adapter(names, adapter)  # before a browser or Node starts
    if decode_forms == "both":
        _check_both_forms(runtime, graph_capture, bool(rounds or first_use))
    if rounds or first_use:
        from webbuild.tools.bench.rounds import RoundsOptions, run_rounds

        lengths = _seconds_list(first_use) if first_use else []
        default_rows = ["chromium-webbuild", *(["chromium-peer"] if peer else []), "node-webbuild"]
        result = run_rounds(RoundsOptions(
            dir, list(rows) or (default_rows if rounds else []), rounds or 0, peer, short_decode, decode_tokens,
            1 if max_clips is None else max_clips, max_new_tokens or 16, prompt_tokens,
            allow_software=allow_software, adapter=adapter, timing=timing, step_trace=step_trace,
            first_use=lengths, first_use_ep="wasm" if ep == "wasm" else "webgpu", one_page=one_page,
            first_use_query=first_use_query, out=report))
        click.echo("\n".join(m for m in (result["markdown"] if result["table"] else "",
                                          result.get("first_use", {}).get("markdown", "")) if m))
        return
    with gpu_clock.ClockSampler() as clocks:  # the GPU's own clock beside its figures, where nvidia-smi is
        start = gpu_clock.now()
        result = _bench_run(dir, runtime, ep, decode_tokens, repeat, max_clips, max_new_tokens, swiftshader,
                            session_config, graph_capture, adapter, threads, warm_up, decode_forms)
        result["gpu_clock"] = clocks.window(start, gpu_clock.now())
    click.echo(table(result))
    if report:
        report.write_text(json.dumps(result, indent=1) + "\n")
        click.echo(f"report: {report}")


def _check_both_forms(runtime: str, graph_capture: bool, rounds: bool) -> None:
    """--decode-forms both is bench.mjs's (Node) and sets plain steps beside the captured form: refused where
    either is missing, rather than a report with one form."""
    why = ("--runtime browser" if runtime == "browser" else "--rounds or --first-use" if rounds
           else "--no-graph-capture (plain steps alone)" if not graph_capture else None)
    if why:
        raise BenchError(f"--decode-forms both (the captured form, then plain steps, under Node) does not go "
                         f"with {why}")


def _seconds_list(text: str) -> list[float]:
    """--first-use's clip lengths: positive seconds, comma-separated."""
    try:
        lengths = [float(x) for x in text.split(",")]
    except ValueError:
        lengths = []
    if not lengths or any(not 0 < s <= 600 for s in lengths):
        raise BenchError(f"--first-use {text!r}: clip lengths in seconds, each above 0 and at most 600, "
                         "comma-separated, e.g. 1,2.5,5")
    return lengths


def _bench_run(dir: Path, runtime: str, ep: str, decode_tokens: int, repeat: int, max_clips: int | None,
               max_new_tokens: int | None, swiftshader: bool, session_config: tuple[str, ...], graph_capture: bool,
               adapter: str | None, threads: int | None, warm_up: str = WARM_UPS[0],
               decode_forms: str = DECODE_FORMS[0]) -> dict:
    """`webbuild bench`'s run in the page (--runtime browser) or under Node: its report."""
    from webbuild.tools.bench import run_node

    if runtime == "browser":
        from webbuild.tools.bench.page_bench import run_browser

        return run_browser(dir, ep, repeat, max_clips, decode_tokens, adapter=adapter, threads=threads,
                           max_new_tokens=max_new_tokens, warm_up=warm_up)
    else:
        if threads is not None:
            raise BenchError("--threads is for --runtime browser: under Node onnxruntime-web runs 1 thread "
                             "(its threaded glue does not load from file: URLs)")
        config = dict(entry.split("=", 1) for entry in session_config if "=" in entry)
        if len(config) != len(session_config):
            raise BenchError(f"--session-config wants KEY=VALUE, got "
                             f"{', '.join(e for e in session_config if '=' not in e)}")
        return run_node(dir, ep, decode_tokens, repeat, max_clips, swiftshader, session_config=config,
                        graph_capture=graph_capture, max_new_tokens=max_new_tokens, adapter=adapter,
                        warm_up=warm_up, decode_forms=decode_forms)


if __name__ == "__main__":
    main()

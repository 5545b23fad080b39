"""`webbuild init SOURCE_DIR`: a commented model.yaml for an export, and optionally a GitHub Pages workflow.

The layout is told by the folder's files (webbuild.layouts.detect); the name comes from the folder; sample
clips are WAVs with a same-named .txt transcript beside them (as `webbuild transcribe` and `verify --clips`
read them). The other sections are written as comments holding their defaults (from webbuild.config's
schema, so they cannot drift from it). The new model.yaml is loaded with load_config before it is moved
into place: what init writes builds, and a refused run writes nothing.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import yaml

from webbuild import DISTRIBUTION, layouts, version
from webbuild.config import BuildConfig, load_config
from webbuild.errors import ConfigError, InitError

WORKFLOW_TEMPLATE = Path(__file__).resolve().with_name("pages.yml")
WORKFLOW_PATH = Path(".github") / "workflows" / "pages.yml"  # relative to model.yaml's folder, the repository root
WORKFLOWS = ("pages",)
# the sections written as commented defaults, in the reference's order
DEFAULT_SECTIONS = ("variants", "fusion", "quantize", "encoder", "chunking", "shard", "verify")


@dataclass(frozen=True)
class Sample:
    audio: Path
    text: str


def model_name(folder: Path) -> str:
    """model.yaml `name` from a folder name: lower case, runs of other characters as one '-'."""
    return re.sub(r"[^a-z0-9._-]+", "-", folder.resolve().name.lower()).lstrip("._-")


def find_samples(paths: tuple[Path, ...]) -> list[Sample]:
    """Each WAV (or the WAVs of each folder, sorted) with the text of its same-named .txt."""
    wavs: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.suffix.lower() == ".wav")
            if not found:
                raise InitError(f"--samples {p}: the folder holds no .wav file")
            wavs += found
        elif p.is_file() and p.suffix.lower() == ".wav":
            wavs.append(p)
        else:
            raise InitError(f"--samples {p}: not a .wav file or a folder of them")
    samples = []
    for wav in wavs:
        txt = wav.with_suffix(".txt")
        text = " ".join(txt.read_text(encoding="utf-8").split()) if txt.is_file() else ""
        if not text:
            raise InitError(f"--samples: {wav} has no transcript; put its text into {txt}")
        samples.append(Sample(wav, text))
    return samples


def model_yaml(source: Path, layout: layouts.Layout, name: str, samples: list[Sample], root: Path) -> str:
    """The text of a model.yaml in folder `root` for `source`: the keys a build needs, then every other
    section's defaults as comments."""
    def rel(p: Path) -> str:
        return Path(os.path.relpath(p.resolve(), root.resolve())).as_posix()

    def flow(value) -> str:
        text = yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False)
        return text.strip().removesuffix("...").strip()  # a plain scalar's document ends with '...'

    lines = [f"# model.yaml for {source.name}/ (layout {layout.name}, told by its files), written by `webbuild init`.",
             "# Build it: webbuild model.yaml. Every key with its meaning: docs/model-yaml.md of webbuild.",
             f"name: {name}  # model id: lower-case letters, digits, . _ -",
             f"source: {flow({'layout': layout.name, 'dir': './' + rel(source)})}  # dir relative to this file",
             "output: dist  # the site's folder, relative to this file (-o overrides)",
             "site:",
             f"  title: {flow(name)}  # the page's title",
             "  base_path: /  # the URL path the site is served under: /REPO/ for https://USER.github.io/REPO/"]
    if samples:
        lines.append("  samples:  # clips on the page, checked by the build and by `webbuild verify`")
        lines += [f"    - {flow({'audio': rel(s.audio), 'text': s.text})}" for s in samples]
    else:
        lines.append("  samples: []  # clips on the page: - {audio: clip.wav, text: its transcript}")
    lines.append("")
    lines.append("# The other sections at their defaults: uncomment a line to change it.")
    for key in DEFAULT_SECTIONS:
        field = BuildConfig.model_fields[key]
        value = field.get_default(call_default_factory=True)
        if hasattr(value, "model_dump"):
            value = value.model_dump(mode="json", exclude_none=True)
        lines.append(f"# {key}: {flow(value)}  # {field.description}")
    return "\n".join(lines) + "\n"


def default_webbuild() -> str:
    """The workflow's pip requirement: this distribution, with the verify extra, at the version running now
    (the workflow builds with the webbuild the model.yaml was written for)."""
    try:
        return f"{DISTRIBUTION}[verify]=={version()}"
    except metadata.PackageNotFoundError:
        raise InitError(f"the {DISTRIBUTION} distribution is not installed here (webbuild runs from a source tree): "
                        "install it (pip install -e .) or name the workflow's requirement with --webbuild") from None


def workflow_yaml(model: str, webbuild: str) -> str:
    """The GitHub Pages workflow: build `model` (relative to the repository root), verify, deploy."""
    return WORKFLOW_TEMPLATE.read_text().replace("@MODEL@", model).replace("@WEBBUILD@", webbuild)


def init(source: Path, output: Path, *, name: str | None, samples: tuple[Path, ...], workflow: str | None,
         webbuild: str | None, force: bool) -> list[Path]:
    """Write `output` (a model.yaml) for `source`, and the workflow beside it; returns the files written.
    `webbuild`: the workflow's pip requirement (None: default_webbuild())."""
    if not source.is_dir():
        raise InitError(f"{source}: no such folder; pass the folder of a Qwen3-ASR ONNX export")
    layout = layouts.detect(source)
    if layout is None:
        raise InitError(f"{source} is not a Qwen3-ASR ONNX export: it holds none of {layouts.detect_hint()}")
    name = name or model_name(source)
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", name):
        raise InitError(f"{source}: cannot make a model name of the folder name; give one with --name "
                        "(lower-case letters, digits, . _ -)")
    root = output.parent
    if not root.is_dir():
        raise InitError(f"-o {output}: folder {root} does not exist; create it first")
    targets = [output] + ([root / WORKFLOW_PATH] if workflow else [])
    if not force and (there := [t for t in targets if t.exists()]):
        raise InitError(f"{there[0]} exists; pass --force to overwrite it")
    found = find_samples(samples)
    if workflow and not found:
        raise InitError(f"--workflow {workflow}: the workflow's `webbuild verify` transcribes the page's sample clips, "
                        "and there are none; pass --samples (WAVs, or a folder of them, each with a same-named .txt "
                        "transcript)")
    text = model_yaml(source, layout, name, found, root)
    _check(text, output)
    written = [_write(output, text)]
    if workflow:
        written.append(_write(root / WORKFLOW_PATH, workflow_yaml(output.name, webbuild or default_webbuild())))
    return written


def _check(text: str, output: Path) -> None:
    """load_config on the new text, as a file in output's folder (relative paths resolve the same); its
    problems (a sample that is not there, a file the layout needs) are init's error."""
    with tempfile.NamedTemporaryFile("w", dir=output.parent, prefix=".model-", suffix=".yaml") as f:
        f.write(text)
        f.flush()
        try:
            load_config(Path(f.name))
        except ConfigError as e:
            raise InitError(e.lines()[0].replace(f.name, str(output))) from None


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path

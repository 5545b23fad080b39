"""Render stage: webbuild/template/ -> dist/ (pages, app, worker, runtime, ORT glue, samples, samples.json, _headers).

Files named ``*.j2`` are Jinja2 templates and lose the suffix; everything else is copied as is (the isolation
service worker only where ``site.isolation_worker`` is on).
Every URL inside the site is relative, so one build works at any path; ``site.base_path`` is used
where hosts need absolute paths (``_headers``).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import jinja2

from webbuild.config import BuildConfig
from webbuild.errors import BuildError
from webbuild.pipeline.build_report import REPORT_NAME
from webbuild.site.contract import ISOLATION_WORKER, ORT_DIR, ORT_MODULES, SAMPLES_FILE
from webbuild.site.ort_files import OrtFilesError, ort_dir, vad_dir

TEMPLATE_DIR = Path(__file__).resolve().parents[1] / "template"
SKIP = {"tests", "__init__.py", "__pycache__", "_headers.j2"}


def ort_dist() -> Path:
    """The onnxruntime-web files a site ships, package data at the locked version (webbuild.site.ort_files)."""
    try:
        return ort_dir()
    except OrtFilesError as e:
        raise BuildError(str(e)) from None


def vad_dist() -> Path:
    """Silero VAD's model, package data at the locked version (webbuild.site.ort_files)."""
    try:
        return vad_dir()
    except OrtFilesError as e:
        raise BuildError(str(e)) from None


def render_site(cfg: BuildConfig, dist: Path, runtime: dict) -> list[str]:
    """Write the site's pages and scripts into `dist` (the model shards are written separately).

    Returns warnings (theme colours too close for readable text)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATE_DIR), autoescape=True,
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    context = site_context(cfg, runtime)
    skip = SKIP if cfg.site.isolation_worker else SKIP | {ISOLATION_WORKER}
    for src in sorted(TEMPLATE_DIR.rglob("*")):
        rel = src.relative_to(TEMPLATE_DIR)
        if src.is_dir() or skip & set(rel.parts):
            continue
        dest = dist / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.suffix == ".j2":
            dest.with_suffix("").write_text(env.get_template(rel.as_posix()).render(**context))
        else:
            shutil.copyfile(src, dest)
    _copy_ort(dist / ORT_DIR)
    _copy_samples(cfg, dist / "samples")
    _write_samples_file(cfg, dist / SAMPLES_FILE)
    (dist / "_headers").write_text(env.get_template("_headers.j2").render(**context))
    return theme_warnings(cfg.site.theme)


def theme_warnings(theme) -> list[str]:
    """WCAG AA wants 4.5:1 for body text: text on background, and white button labels on accent."""
    pairs = [("site.theme.text on site.theme.background", theme.text, theme.background),
             ("button labels (#ffffff) on site.theme.accent", "#ffffff", theme.accent)]
    return [f"{what}: contrast {ratio:.1f}:1 is below 4.5:1; text will be hard to read"
            for what, a, b in pairs if (ratio := contrast_ratio(a, b)) < 4.5]


def contrast_ratio(a: str, b: str) -> float:
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def _luminance(colour: str) -> float:
    def channel(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (channel(int(colour[i:i + 2], 16) / 255) for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def site_context(cfg: BuildConfig, runtime: dict) -> dict:
    return {
        "title": cfg.title, "name": cfg.name, "base_path": cfg.site.base_path, "theme": cfg.site.theme,
        "variants": runtime.get("variants", []),
        "isolation_worker": ISOLATION_WORKER if cfg.site.isolation_worker else "",  # index.html's meta names it
    }


def _write_samples_file(cfg: BuildConfig, dest: Path) -> None:
    """The one list of the site's sample clips: the page shows them (app.js), `webbuild verify`, the bench and
    the tests transcribe them; with their expected texts, the WER bound and the decode speed floors verify
    checks (read from the site, so that verify of a deployed URL checks them too)."""
    samples = [{"id": f"sample-{i}", "src": f"samples/{_sample_name(i, s.audio)}", "text": s.text,
                "label": s.audio.stem.replace("_", " ").replace("-", " "),
                **({"language": s.language} if s.language else {})}
               for i, s in enumerate(cfg.site.samples)]
    dest.write_text(json.dumps({"name": cfg.name, "base_path": cfg.site.base_path,
                                "max_wer": cfg.verify.max_wer,
                                "min_decode_tokens_per_s": cfg.verify.decode_floors(), "samples": samples},
                               indent=1) + "\n")


def _sample_name(i: int, audio: Path) -> str:
    return f"{i:02d}-{re.sub(r'[^A-Za-z0-9._-]+', '_', audio.name)}"


def _copy_samples(cfg: BuildConfig, dest: Path) -> None:
    if not cfg.site.samples:
        return
    dest.mkdir(exist_ok=True)
    for i, s in enumerate(cfg.site.samples):
        shutil.copyfile(s.audio, dest / _sample_name(i, s.audio))


def _copy_ort(dest: Path) -> None:
    src = ort_dist()
    dest.mkdir(exist_ok=True)
    for name in ORT_MODULES:
        shutil.copyfile(src / name, dest / name)


def copy_static(static: Path, site: Path) -> None:
    """model.yaml site.static's files into the site, as they are; one the build wrote itself is an error."""
    files = [p for p in sorted(static.rglob("*")) if p.is_file()]
    if clash := [p.relative_to(static).as_posix() for p in files
                 if (site / p.relative_to(static)).exists() or p.relative_to(static).as_posix() == REPORT_NAME]:
        raise BuildError(f"site.static: {static / clash[0]} has the name of a file the build writes "
                         f"({clash[0]}); rename or remove it")
    for p in files:
        dest = site / p.relative_to(static)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copy2(p, dest)
        except PermissionError as exc:
            raise BuildError(f"site.static: cannot read {p} ({exc.strerror}); make it readable or remove it") from None

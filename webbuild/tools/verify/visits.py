"""The checks behind `webbuild verify`: a built folder (served here on loopback) or a deployed URL,
driven in Chrome/Chromium with Playwright. Returns a report dict (see report.py for its printing).

Three visits, and one more per further --clips-ep:
1. fresh browser profile, one shard corrupted in transit once: the loader must notice and recover;
   every sample (and the --clips, unless --clips-ep puts them on their own visits) is transcribed; where
   the site ships LoRA adapters (docs/adapters.md), the samples again with each adapter picked, then with
   none again, which must give the first tokens exactly;
2. same profile again: the model must come from the Cache API (no shard requests); the --clips run
   here on the first --clips-ep, then on each further one on a visit of its own (same profile), or on
   the first visit's page where that provider is --ep's;
3. a browser with WebGPU switched off: the site must fall back to wasm and still transcribe.
Across all of them: no request leaves the site's origin and the console shows no errors.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from webbuild.errors import VerifyInputError, require_extra
from webbuild.reference.wer import corpus_wer, wer
from webbuild.site.contract import CONTEXT_FIELD, LANGUAGE_PICKER, LORA_PICKER, SAMPLES_FILE
from webbuild.text import one_line, plural
from webbuild.tools import browser as br
from webbuild.tools.verify.tokens import MAX_TIE_MARGIN, first_difference, flatten, margin_drift, token_summary

if TYPE_CHECKING:
    from webbuild.reference.transcribe import Transcriber

SHARDS = "**/model/shards/*"
DONE = "() => window.webbuild.status === 'done' || window.webbuild.error"
log = logging.getLogger(__name__)

@dataclass(frozen=True)
class ClipsRun:
    """--clips-ep EP[:N]: the --clips on provider `ep` ('auto': the page's choice), the first `count` only."""

    ep: str
    count: int | None = None  # None: all

    def pick(self, clips: list[Clip]) -> list[Clip]:
        return clips[:self.count] if self.count is not None else clips


@dataclass
class Options:
    target: str
    clips: Path | None = None
    browser: str | None = None
    ep: str | None = None  # None: the page's own choice
    clips_eps: tuple[ClipsRun, ...] = ()  # empty: the clips on the samples' page; else a visit per provider
    clips_max_wer: float | None = None  # the --clips' corpus WER bound; None: the site's verify.max_wer
    clips_max_clip_wer: float | None = None  # a bound on each --clips clip's own WER; None: not judged per clip
    timeout_s: float = 600
    min_decode_tokens_per_s: dict[str, float] = field(default_factory=dict)  # provider -> floor, over the site's
    live: str = "on"  # the live check (tools/verify/live.py): on, off, or only (no other visit)


@dataclass
class Clip:
    name: str
    text: str
    wav: Path | None = None  # an uploaded file (--clips) ...
    button: str | None = None  # ... or a sample button of the page
    local: Path | None = None  # the audio on this machine, for the Python reference
    src: str | None = None  # a sample's URL path in the site (samples.json)
    language: str | None = None  # the language a sample speaks (samples.json, model.yaml's samples)


def read_clips(folder: Path) -> list[Clip]:
    """*.wav with same-named *.txt transcripts."""
    if not folder.is_dir():
        raise VerifyInputError(f"--clips {folder}: not a folder")
    wavs = sorted(folder.glob("*.wav"))
    if not wavs:
        raise VerifyInputError(f"--clips {folder}: no *.wav files")
    missing = [w.name for w in wavs if not w.with_suffix(".txt").is_file()]
    if missing:
        raise VerifyInputError(f"--clips {folder}: no transcript (.txt) for {', '.join(missing[:5])}")
    return [Clip(w.name, w.with_suffix(".txt").read_text().strip(), wav=w, local=w) for w in wavs]


def source_format(path: Path | None) -> dict:
    """A clip's rate and channel count as its WAV header gives them (the e2e summary counts per rate)."""
    if path is None:
        return {"rate": None, "channels": None}
    from webbuild.errors import AudioError
    from webbuild.reference.wav import wav_info

    try:
        info = wav_info(path)
    except AudioError:
        return {"rate": None, "channels": None}
    return {"rate": info.rate, "channels": info.channels}


@contextlib.contextmanager
def site_url(target: str):
    """(url ending in '/', local dist or None): a folder is served on loopback at its base path."""
    if urlsplit(target).scheme in ("http", "https"):
        yield (target if target.endswith("/") else target + "/"), None
        return
    dist = Path(target)
    if not dist.is_dir():
        raise VerifyInputError(f"{target}: no such folder; pass a built site folder (webbuild model.yaml) or a URL")
    if not (dist / "index.html").is_file():
        raise VerifyInputError(f"{target}: no index.html; pass a built site folder (webbuild model.yaml) or a URL")
    from webbuild.tools.serve import start

    base = _check_local_site(dist)
    srv = start(dist, quiet=True, base_path=base)
    try:
        yield srv.url, dist
    finally:
        srv.shutdown()


def check_reachable(target: str, timeout_s: float = 30) -> None:
    """A URL target answers over HTTP at all, before a browser starts (nothing listening was a 63-line
    Playwright traceback). An HTTP error status is an answer: samples.json's request tells what is wrong."""
    if urlsplit(target).scheme not in ("http", "https"):
        return
    try:
        urllib.request.urlopen(target, timeout=timeout_s).close()  # noqa: S310 - the user's http(s) URL
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise VerifyInputError(f"{target}: cannot reach it ({one_line(str(reason))}); check the URL, and that the "
                               "site is being served there") from None


def _check_local_site(dist: Path) -> str:
    """A local site's files checked before a browser is started: its shards and manifest as the page checks
    them (a site damaged on disk is one line, not a failing page) and samples.json; its base path."""
    from webbuild.reference.source_files import read_json
    from webbuild.site.manifest import check_shards, load_manifest

    if (dist / "model" / "manifest.json").is_file():
        check_shards(dist / "model", load_manifest(dist / "model"))
    data = dist / SAMPLES_FILE
    base = read_json(data, "rebuild the site").get("base_path", "/") if data.is_file() else "/"
    if not isinstance(base, str):
        raise VerifyInputError(f"{data}: base_path is {base!r}, not a path; rebuild the site")
    return base


def site_data(context, url: str) -> dict:
    """samples.json of the site (samples, expected texts, verify.max_wer)."""
    res = context.request.get(url + SAMPLES_FILE)
    if not res.ok:
        raise VerifyInputError(f"{url}{SAMPLES_FILE}: HTTP {res.status}; rebuild the site with this webbuild")
    return res.json()


def wasm_unfit(context, url: str) -> str | None:
    """Why the site's wasm variant does not fit a tab (manifest entry `wasm.fits` false,
    webbuild/pipeline/wasm_budget.py), else None; the variant as runtime/probe.js chooseVariant picks it."""
    res = context.request.get(url + "model/manifest.json")
    variants = res.json().get("variants", {}) if res.ok else {}
    runs_wasm = [e for e in variants.values() if "wasm" in e.get("providers", [])]
    entry: dict = (runs_wasm or list(variants.values()) or [{}])[0]
    wasm = entry.get("wasm") or {}
    if wasm.get("fits") is not False:
        return None
    return f"wasm needs {wasm['need_bytes'] / 2**30:.1f} GiB of {wasm['budget_bytes'] / 2**30:.1f} GiB"


@dataclass
class Expected:
    """The Python reference's transcript of a clip: its text, greedy tokens and their margins."""

    text: str
    tokens: list[int]
    margins: list[float]
    cut: bool = False  # a chunk's decode stopped at its max_new_tokens, not at the end token: the text is partial


class Reference:
    """The Python reference on a local build's own graphs, loaded once per variant, LoRA adapter and EP: on
    wasm the graphs the wasm EP runs (the int8 twins with the weights the page derives), as the page does."""

    def __init__(self, dist: Path | None):
        self.dist = dist
        self.loaded: dict[tuple[str, str | None, str], Transcriber] = {}

    def transcriber(self, variant: str | None, lora: str | None = None, ep: str = "webgpu") -> Transcriber | None:
        """The reference for a variant (None: a deployed site, which has none here)."""
        if self.dist is None or variant is None:
            return None
        from webbuild.reference.transcribe import load_transcriber

        if (variant, lora, ep) not in self.loaded:
            self.loaded[variant, lora, ep] = load_transcriber(self.dist, variant, adapter=lora, ep=ep)
        return self.loaded[variant, lora, ep]

    def transcribe(self, clip: Clip, variant: str, lora: str | None = None,
                   max_new_tokens: int | None = None, ep: str = "webgpu",
                   language: str | None = None, context: str | None = None) -> Expected | None:
        """max_new_tokens: per chunk, as the page's ?max_new_tokens= bounds it (None: the reference's default);
        language: the one the page's picker forced (None: automatic); context: the page's context field (None:
        the site's default, model.yaml's)."""
        t = self.transcriber(variant, lora, ep)
        if t is None or clip.local is None:
            return None
        bound = {} if max_new_tokens is None else {"max_new_tokens": max_new_tokens}
        default = t.context
        t.force_language(language)
        try:
            t.give_context(default if context is None else context)
            chunks = t.decode_file(clip.local, **bound)  # cut into chunks as the page cuts them
        finally:
            t.force_language(None)  # the transcriber is shared (the live check's too)
            t.context = default
        cut = max_new_tokens is not None and any(len(c.tokens) >= max_new_tokens for c in chunks)
        return Expected(t.file_text(chunks), [x for c in chunks for x in c.tokens],
                        [m for c in chunks for m in c.margins], cut)


# The wasm-fallback visit's clip decodes at most this many tokens a chunk (the page's ?max_new_tokens=, the
# reference alike): a sample's answer fits, and a model that never ends (random weights) stops here instead of
# decoding the whole max_new_tokens on wasm (the 1.7b's 200 took longer than a 10-minute device call).
FALLBACK_MAX_TOKENS = 48


def corrupt_warning(state: dict, shard: str) -> tuple[bool, list[str]]:
    """Whether the page warned once of shard `shard` arriving damaged, by the warning's code and shard
    (window.webbuild.warningCodes, runtime/contract.js WarningMessage), not its words, which are the visitor's and
    may change; the shown words must not name the shard (its internal name is the console's). Also every warning's
    code:shard, for the check's detail."""
    codes = state.get("warningCodes", [])
    said = [(w["shard"] or "", words) for w, words in zip(codes, state.get("warnings", []), strict=False)
            if w["code"] == "corrupt"]
    noticed = len(said) == 1 and said[0][0].rsplit("/", 1)[-1] == shard and shard not in said[0][1]
    return noticed, [f"{w['code']}:{w['shard']}" for w in codes]


def query(ep: str | None) -> str:
    return f"?ep={ep}" if ep and ep != "auto" else ""


def transcribe(page, clip: Clip, timeout_s: float) -> dict:
    if clip.button:
        page.click(f"#{clip.button}")
    else:
        page.set_input_files("#file", str(clip.wav))
    br.wait_for(page, DONE, timeout_s)
    return page.evaluate("() => window.webbuild")


def picked_language(page) -> str | None:
    """The language the page's picker forces (None: automatic, or a page without the picker)."""
    return page.evaluate(f"() => document.getElementById({json.dumps(LANGUAGE_PICKER)})?.value || null")


def given_context(page) -> str | None:
    """The text in the page's context field, as the page sends it (None: a page without the field)."""
    return page.evaluate(f"() => {{ const f = document.getElementById({json.dumps(CONTEXT_FIELD)}); "
                         "return f && !f.disabled ? f.value.trim() : null; }")


def switch_lora(page, name: str | None, timeout_s: float) -> str | None:
    """Picks LoRA adapter `name` (None: the base model) in the page's picker and waits for the worker to
    switch; the page's error, else None."""
    page.select_option(f"#{LORA_PICKER}", name or "")
    br.wait_for(page, f"() => window.webbuild.lora === {json.dumps(name)} || window.webbuild.error", timeout_s)
    return page.evaluate("() => window.webbuild.error")


VISIT_INFO = ("ep", "variant", "gpu", "threads", "kvCache", "decode", "load", "loraAdapters")  # the ready info

def against_reference(state: dict, ref: Expected | None) -> tuple[dict, str | None]:
    """The page's tokens against the reference's (tokens.py): the row's fields (both token lists with
    their margins, the first difference, whether it passes under the margin, the margin drift before it)
    and why the clip fails on them, else None."""
    tokens, margins = flatten(state.get("tokens")), flatten(state.get("margins"))
    fields: dict[str, Any] = {"tokens": tokens, "margins": margins, "reference_tokens": ref and ref.tokens,
              "reference_margins": ref and ref.margins, "difference": None, "under_margin": False,
              "margin_drift": None}
    if ref is None or state["error"] is not None:
        return fields, None
    if tokens is None:
        return fields, "the page reported no tokens to compare with the Python reference's"
    diff = first_difference(tokens, margins, ref.tokens, ref.margins)
    fields["margin_drift"] = margin_drift(margins, ref.margins, len(ref.tokens) if diff is None else diff.position)
    if diff is None:  # same tokens, other text: the page's detokenisation is wrong
        return fields, None if state["text"] == ref.text else (
            f"same tokens as the Python reference but other text: got {state['text']!r}, reference {ref.text!r}")
    fields |= {"difference": diff.as_dict(), "under_margin": diff.under_margin}
    return fields, None if diff.under_margin else (
        f"{diff.describe()}; a difference passes only with its margins under {MAX_TIE_MARGIN}: "
        f"got {state['text']!r}, reference {ref.text!r}")


def row(clip: Clip, state: dict, ref: Expected | None, max_wer: float | None, run: str,
        lora: str | None = None) -> dict:
    """One clip's result. max_wer None: the WER is not judged (a LoRA adapter's transcript, whose model
    was adapted away from the clip's text); lora: the adapter the page must have transcribed with."""
    got, m = state["text"], state.get("metrics") or {}
    rate = wer(clip.text, got) if state["error"] is None else 1.0
    compared, differs = against_reference(state, ref)
    reason: str | None
    if state["error"] is not None:
        reason = f"error: {state['error']}"
    elif state.get("doneLora") != lora:
        reason = f"transcribed with adapter {state.get('doneLora')!r}, not {lora!r}"
    elif max_wer is not None and rate > max_wer:
        reason = f"WER {rate:.2f} > {max_wer:.2f}: expected {clip.text!r}, got {got!r}"
    else:
        reason = differs
    return {"clip": clip.name, "run": run, "ep": state["info"]["ep"], "expected": clip.text, "got": got,
            "reference": ref and ref.text, "wer": rate, "max_wer": max_wer, "ok": reason is None,
            "reason": reason and one_line(reason), "error": state["error"], **compared, **source_format(clip.local),
            **{k: m.get(k) for k in ("audio_ms", "encoder_ms", "ttft_ms", "prompt_tokens", "prefill_tokens_per_s",
                                     "generated_tokens", "decode_tokens", "decode_ms", "decode_tokens_per_s",
                                     "total_ms", "rtf")}}


class Verifier:
    def __init__(self, opts: Options):
        self.opts = opts
        self.rows: list[dict] = []
        self.checks: list[dict] = []
        self.log: dict[str, list] = {"requests": [], "console": [], "errors": []}
        self.visits: dict[str, dict] = {}
        self.reference = Reference(None)
        self.live: dict | None = None  # the live check's measurements (tools/verify/live.py measure)

    def check(self, name: str, ok: object, detail: str = "") -> bool:
        """Record a check; its detail is one line (the reason shown when it fails, in the table and JUnit)."""
        detail = one_line(detail)
        self.checks.append({"name": name, "ok": bool(ok), "detail": detail})
        log.info(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
        return bool(ok)

    def open(self, context, url: str, name: str, expect_ready: bool = True) -> tuple:
        page = context.new_page()
        br.watch(page, self.log)
        start = len(self.log["requests"])
        t0 = time.monotonic()
        with contextlib.suppress(TimeoutError):  # still loading: reported below as not ready
            br.open_page(page, url, self.opts.timeout_s)
        state = page.evaluate("() => window.webbuild") or {"status": "no page state", "error": "app did not start"}
        info = state.get("info") or {}
        self.visits[name] = {"url": url, "status": state["status"], "error": state["error"],
                             "wall_s": round(time.monotonic() - t0, 2), "warnings": state.get("warnings", []),
                             **{k: info.get(k) for k in VISIT_INFO}}
        log.info(f"{name}: {state['status']} on {info.get('ep')} ({info.get('variant')}) in "
                 f"{self.visits[name]['wall_s']} s")
        ready = state["status"] == "ready"
        if expect_ready:
            self.check(f"{name}: model loads", ready, state["error"] or "")
        return page, state, self.log["requests"][start:], ready

    def run_clips(self, page, clips: list[Clip], state: dict, max_wer: float | None, run: str,
                  lora: str | None = None, max_new_tokens: int | None = None) -> None:
        """max_new_tokens: the bound the page was opened with (?max_new_tokens=), which the reference decodes
        under too; a clip whose reference it cut has its tokens compared but not its WER judged."""
        variant = state["info"]["variant"]
        language, context = picked_language(page), given_context(page)
        for clip in clips:
            try:
                result = transcribe(page, clip, self.opts.timeout_s)
            except TimeoutError as exc:
                result = {**state, "status": "timeout", "text": "", "metrics": None, "error": str(exc)}
            ref = self.reference.transcribe(clip, variant, lora, max_new_tokens, state["info"].get("ep") or "webgpu",
                                            language, context)
            self.rows.append(row(clip, result, ref, None if ref and ref.cut else max_wer, run, lora))
            r = self.rows[-1]
            log.info(f"  {clip.name}: {'ok' if r['ok'] else 'FAIL'} {r['got']!r} (WER {r['wer']:.2f})")
            if result["status"] == "timeout":
                break  # the page is stuck on this clip: the others would only time out too

    def first_visit(self, context, url, samples, clips, max_wer) -> bool:
        corrupted: list[str] = []

        def corrupt_once(route):
            if corrupted:
                return route.continue_()
            corrupted.append(route.request.url)  # before fetch(): other shards' handlers run meanwhile
            res = route.fetch()
            body = bytearray(res.body())
            body[len(body) // 2] ^= 0xFF
            route.fulfill(response=res, body=bytes(body))

        context.route(SHARDS, corrupt_once)
        page, state, requests, ready = self.open(context, url + query(self.opts.ep), "first visit")
        context.unroute(SHARDS)
        shard = corrupted[0].rsplit("/", 1)[-1] if corrupted else "?"
        noticed, codes = corrupt_warning(state, shard)
        refetched = sum(u.split("?")[0].endswith("/" + shard) for u in requests)
        self.check("corrupted shard detected and recovered", bool(corrupted) and noticed and ready and refetched == 2,
                   f"{shard} corrupted once: warning {'shown' if noticed else f'missing (got {codes})'}, "
                   f"fetched {refetched}x, status {state['status']}")
        if ready:
            self.run_clips(page, samples, state, max_wer, "samples")
            self.lora_runs(page, samples, state, max_wer)
            self.language_run(page, samples, state, max_wer)
            self.context_run(page, samples, state)
            if clips and not self.opts.clips_eps:
                self.run_clips(page, clips, state, self.opts.clips_max_clip_wer, "clips")
            for run in self.first_visit_clips() if clips else ():
                self.run_clips(page, run.pick(clips), state, self.opts.clips_max_clip_wer, "clips")
            with contextlib.suppress(TimeoutError):  # the cache writes go on after ready; the second visit reads them
                br.wait_for(page, "() => window.webbuild.cached || window.webbuild.error", self.opts.timeout_s)
        page.close()
        return ready

    def lora_runs(self, page, samples: list[Clip], state: dict, max_wer: float) -> None:
        """The samples with each LoRA adapter of the site picked (against the Python reference with it on,
        the WER not judged), then with none again: the first run's tokens exactly."""
        names = (state.get("info") or {}).get("loraAdapters") or []
        if not names or not samples:
            return
        for name in [*names, None]:
            error = switch_lora(page, name, self.opts.timeout_s)
            what = f"adapter {name}: the picker switches it on" if name else "adapter none: the picker switches back"
            if not self.check(what, error is None, error or ""):
                return
            run = f"samples, adapter {name}" if name else "samples, adapter none again"
            self.run_clips(page, samples, state, None if name else max_wer, run, name)
        tokens = {run: [r["tokens"] for r in self.rows if r["run"] == run]
                  for run in ("samples", "samples, adapter none again")}
        same = tokens["samples"] == tokens["samples, adapter none again"]
        changed = sum(r["tokens"] != t for name in names for r, t in
                      zip([r for r in self.rows if r["run"] == f"samples, adapter {name}"], tokens["samples"]))
        self.check("adapter none again: the first tokens exactly", same,
                   f"{plural(len(samples), 'sample')} after {', '.join(names)}; the adapters changed the tokens "
                   f"of {plural(changed, 'run')}")

    def language_run(self, page, samples: list[Clip], state: dict, max_wer: float) -> None:
        """The samples with a language forced in the page's picker, against the Python reference with it forced:
        each sample that names its language (model.yaml) with that one, its text judged; the others with
        model.yaml's default where it names one, else the model's first, their text not judged (a sample may
        speak another). Then the picker back on its default."""
        info = state.get("info") or {}
        languages, default = info.get("languages") or [], info.get("language") or "auto"
        if not languages or not samples:
            return
        fallback = default if default in languages else languages[0]
        for forced in dict.fromkeys(s.language or fallback for s in samples):
            page.select_option(f"#{LANGUAGE_PICKER}", forced)
            forced_here = [s for s in samples if (s.language or fallback) == forced]
            for judged in (True, False):  # the samples that name this language, then those merely forced to it
                if group := [s for s in forced_here if (s.language is not None) == judged]:
                    self.run_clips(page, group, state, max_wer if judged else None, f"samples, language {forced}")
            named = page.evaluate("() => window.webbuild.language")
            self.check(f"language {forced} forced: the page names it", named == forced, f"the page names {named!r}")
        page.select_option(f"#{LANGUAGE_PICKER}", default if default in languages else "")

    def context_run(self, page, samples: list[Clip], state: dict) -> None:
        """The samples with a context given in the page's context field: the first sample's words (names the
        model should expect), against the Python reference with the same context (the WER not judged: a model
        not trained with context may go astray); then the field back on its default (model.yaml's)."""
        info = state.get("info") or {}
        if not info.get("takesContext") or not samples:
            return
        page.fill(f"#{CONTEXT_FIELD}", samples[0].text)
        self.run_clips(page, samples, state, None, "samples, context")
        page.fill(f"#{CONTEXT_FIELD}", info.get("context") or "")

    def second_visit(self, context, url, clips, max_wer) -> None:
        runs = self.opts.clips_eps if clips else ()
        page, state, requests, ready = self.open(context, url + query(runs[0].ep if runs else self.opts.ep),
                                                 "second visit")
        shard_requests = [u for u in requests if "/model/shards/" in u]
        self.check("second visit loads the model from the cache", ready and not shard_requests,
                   f"{len(shard_requests)} shard requests; load {self._load_ms('second visit')} ms")
        if ready and runs:
            self.run_clips(page, runs[0].pick(clips), state, self.opts.clips_max_clip_wer, "clips")
        page.close()
        on_first = self.first_visit_clips()
        for run in [r for r in runs[1:] if r not in on_first]:  # a visit per further provider, from the same cache
            page, state, _, ready = self.open(context, url + query(run.ep), f"clips on {run.ep}")
            if ready:
                self.run_clips(page, run.pick(clips), state, self.opts.clips_max_clip_wer, "clips")
            page.close()

    def first_visit_clips(self) -> list[ClipsRun]:
        """The further --clips-ep runs (not the first, which is the second visit's) on the provider the first visit
        runs (--ep): on its page, after the samples, which saves a load (on a software GPU, half a minute)."""
        return [r for r in self.opts.clips_eps[1:] if self.opts.ep is not None and r.ep == self.opts.ep]

    def clips_max_wer(self, site_bound: float) -> float:
        return site_bound if self.opts.clips_max_wer is None else self.opts.clips_max_wer

    def corpus_checks(self, site_bound: float) -> None:
        """The --clips judged as a set: per provider, their corpus WER (all words' errors over all words) within
        --clips-max-wer (default the site's verify.max_wer); one model error on one clip does not fail a set."""
        bound = self.clips_max_wer(site_bound)
        for ep in sorted({r["ep"] for r in self.rows if r["run"] == "clips"}):
            rows = [r for r in self.rows if r["run"] == "clips" and r["ep"] == ep]
            rate = corpus_wer([(r["expected"], r["got"]) for r in rows])
            self.check(f"--clips corpus WER on {ep} within the bound", rate <= bound,
                       f"{100 * rate:.2f}% over {plural(len(rows), 'clip')}, bound {100 * bound:.2f}%")

    def fallback_visit(self, playwright, choice, url, clip: Clip | None, max_wer) -> None:
        browser = br.launch(playwright, choice, webgpu=False)
        try:
            context = browser.new_context()
            br.hide_webgpu(context)
            if unfit := wasm_unfit(context, url):  # the build's estimate: the page refuses, as it should
                _, state, _, _ = self.open(context, url, "WebGPU off", expect_ready=False)
                said = state["status"] == "error" and "needs WebGPU" in (state["error"] or "")
                self.check("WebGPU off: the page says the model needs WebGPU", said,
                           f"status {state['status']}: {state['error'] or ''} (build: {unfit})")
                return
            bounded = f"{url}{'&' if '?' in url else '?'}max_new_tokens={FALLBACK_MAX_TOKENS}"
            page, state, _, ready = self.open(context, bounded, "WebGPU off")
            ep = (state.get("info") or {}).get("ep")
            if not self.check("wasm fallback when WebGPU is off", ready and ep == "wasm", f"ep {ep}") or clip is None:
                return
            self.run_clips(page, [clip], state, max_wer, "wasm fallback", max_new_tokens=FALLBACK_MAX_TOKENS)
            self.check("wasm fallback transcribes", self.rows[-1]["ok"], repr(self.rows[-1]["got"]))
        finally:
            browser.close()

    def live_visit(self, playwright, choice, url: str, samples: list[Clip]) -> None:
        """The samples joined with pauses, played into the page's live mode (tools/verify/live.py)."""
        from webbuild.tools.verify import live

        if not samples:
            return
        with tempfile.TemporaryDirectory(prefix="webbuild-verify-") as tmp:
            clips = [c.local or _download(url, c, Path(tmp)) for c in samples]
            result = live.measure(playwright, choice, url + query(self.opts.ep), clips, self.opts.timeout_s, self.log,
                                  self.reference.transcriber)
        self.live = result
        for name, ok, detail in live.judge(result):
            self.check(name, ok, detail)

    def _load_ms(self, visit: str):
        load = self.visits.get(visit, {}).get("load") or {}
        return round(load["total_ms"]) if "total_ms" in load else None

    def final_checks(self, url: str) -> None:
        origin = "{0.scheme}://{0.netloc}/".format(urlsplit(url))
        # blob: URLs of the origin are the page's own object URLs (the chosen clip in its audio player)
        outside = [u for u in self.log["requests"] if not u.startswith((origin, f"blob:{origin}"))]
        self.check("no request leaves the origin", self.log["requests"] and not outside,
                   f"{len(self.log['requests'])} requests, {len(outside)} elsewhere {outside[:3]}")
        errors = [c for c in self.log["console"] if c.startswith("error:")] + self.log["errors"]
        self.check("console has no errors", not errors, "; ".join(errors[:3]))
        if self.opts.live == "only":
            return  # no transcript but the live one
        failed = [r for r in self.rows if not r["ok"]]
        first = f"; first failure {failed[0]['clip']} ({failed[0]['run']}): {failed[0]['reason']}" if failed else ""
        self.check("every transcript within the WER bound (and equal to the Python reference)",
                   self.rows and not failed, f"{len(self.rows) - len(failed)}/{len(self.rows)} clips{first}")

    def speed_checks(self, site_floors: dict) -> dict[str, dict]:
        """Decode tokens/s per provider, over every clip decoded on it without error (tokens over time, so
        long clips weigh more), against its floor: the CLI's, else the site's (model.yaml)."""
        floors = {ep: (v, "model.yaml verify.min_decode_tokens_per_s") for ep, v in site_floors.items()}
        floors |= {ep: (v, "--min-decode-tokens-per-s") for ep, v in self.opts.min_decode_tokens_per_s.items()}
        speeds = {}
        for ep in sorted({r["ep"] for r in self.rows}):
            rows = [r for r in self.rows if r["ep"] == ep and r["error"] is None and r.get("decode_ms")]
            if not rows:
                continue
            rate = 1000 * sum(r["decode_tokens"] for r in rows) / sum(r["decode_ms"] for r in rows)
            floor, source = floors.get(ep, (None, None))
            speeds[ep] = {"decode_tokens_per_s": rate, "clips": len(rows), "floor": floor, "floor_from": source}
            if floor is not None:
                ok = rate >= floor
                self.check(f"decode speed on {ep} at or above the floor", ok,
                           f"measured {rate:.1f} tokens/s on {ep} over {plural(len(rows), 'clip')}, "
                           f"{'at or above' if ok else 'below'} the floor of {floor:g} ({source})")
        for ep in sorted(set(floors) - set(speeds)):
            log.info(f"no clip decoded on {ep}: its floor of {floors[ep][0]:g} tokens/s is not checked")
        return speeds

    def run(self) -> dict:
        check_reachable(self.opts.target, min(self.opts.timeout_s, 30))
        require_extra("verify", "webbuild verify", "playwright")  # `make site` installs no browser driver
        from playwright.sync_api import sync_playwright

        t0 = time.monotonic()
        clips = read_clips(self.opts.clips) if self.opts.clips else []
        choice = br.choose(self.opts.browser)
        with site_url(self.opts.target) as (url, dist), sync_playwright() as pw:
            self.reference = Reference(dist)
            browser = br.launch(pw, choice)
            try:
                context = browser.new_context()
                data = site_data(context, url)
                max_wer = float(data.get("max_wer", 0.0))
                samples = [Clip(Path(s["src"]).name, s["text"], button=s["id"], local=dist / s["src"] if dist else None,
                                src=s["src"], language=s.get("language")) for s in data["samples"]]
                if self.opts.live != "only" and self.first_visit(context, url, samples, clips, max_wer):
                    self.second_visit(context, url, clips, max_wer)
            finally:
                browser.close()
            if self.opts.live != "only":
                self.fallback_visit(pw, choice, url, next(iter(samples or clips), None), max_wer)
                self.corpus_checks(max_wer)
            if self.opts.live != "off":
                self.live_visit(pw, choice, url, samples)
            self.final_checks(url)
            speeds = self.speed_checks(data.get("min_decode_tokens_per_s") or {})
        return self.report(choice, url, max_wer, speeds, time.monotonic() - t0)

    def report(self, choice, url: str, max_wer: float, speeds: dict, seconds: float) -> dict:
        first = self.visits.get("first visit", {})
        return {
            "target": self.opts.target, "url": url, "browser": choice.describe(),
            "ok": all(c["ok"] for c in self.checks),
            "ep": first.get("ep"), "variant": first.get("variant"), "gpu": first.get("gpu"),
            "max_wer": max_wer, "reference": self.reference.dist is not None,
            "load_ms": {"cold": self._load_ms("first visit"), "warm": self._load_ms("second visit")},
            "clips_wer": corpus_wer([(r["expected"], r["got"]) for r in self.rows if r["run"] == "clips"]),
            "reference_equal": sum(r["got"] == r["reference"] for r in self.rows if r["reference"] is not None),
            **token_summary(self.rows),
            "decode_speed": speeds,
            "visits": self.visits, "checks": self.checks, "clips": self.rows, "duration_s": round(seconds, 1),
            "live": self.live,
        }


def _download(url: str, clip: Clip, folder: Path) -> Path:
    """A deployed site's sample clip (its button's audio, samples.json `src`) into `folder`."""
    path = folder / clip.name
    with urllib.request.urlopen(url + str(clip.src)) as res:  # noqa: S310 - the site's own https/http URL
        path.write_bytes(res.read())
    return path


def verify(opts: Options) -> dict:
    return Verifier(opts).run()

"""The answer's language: detected (parsed from `language <Name><asr_text>`) and forced (its answer prefix after
the prompt), in model.yaml, runtime.json, the Python reference and `webbuild transcribe`."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from tokenizers import Tokenizer

from tests.example_config import EXAMPLE
from webbuild.cli import main
from webbuild.config import load_config
from webbuild.pipeline.assemble import runtime_config
from webbuild.reference.audio import read_wav
from webbuild.reference.mel import lead_samples
from webbuild.reference.prompt import PROMPT_PREFIX, PROMPT_SUFFIX, build_prompt, language_ids, parse_language
from webbuild.reference.tokenizer import build_tokenizer
from webbuild.reference.transcribe import SiteCodec, TokenizerCodec, load_transcriber

TEXT = ["the quick brown fox jumps over the lazy dog system user assistant language English Chinese"] * 5


def test_a_forced_language_puts_its_answer_prefix_after_the_prompt():
    tok = build_tokenizer(TEXT, 300)
    plain, forced = build_prompt(tok, 26), build_prompt(tok, 26, "Chinese")
    assert forced.ids == plain.ids + language_ids(tok, "Chinese")
    assert (forced.audio_offset, forced.audio_tokens) == (plain.audio_offset, plain.audio_tokens)
    text = tok.decode(forced.ids, skip_special_tokens=False)
    assert text == PROMPT_PREFIX + "<|audio_pad|>" * 26 + PROMPT_SUFFIX + "language Chinese<asr_text>"


@pytest.mark.parametrize("decoded, language", [
    ("language English<asr_text>hello world<|im_end|>", "English"),
    ("language Chinese<asr_text>你好", "Chinese"),
    ("language None<asr_text><|im_end|>", None),  # Qwen3-ASR's answer where it hears no speech
    ("language Eng", None),  # not yet at the text marker: no name yet
    ("hello world", None),
])
def test_the_answer_names_its_language(decoded, language):
    assert parse_language(decoded) == language


@pytest.fixture(scope="module")
def example_tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(EXAMPLE / "model" / "tokenizer.json"))


def test_runtime_json_carries_each_languages_prefix_ids_and_the_site_codec_builds_the_same_prompt(example_tokenizer):
    cfg = json.loads((EXAMPLE / "model" / "config.json").read_text())
    rt = runtime_config(cfg, example_tokenizer, languages=("English", "German"), language="English")
    assert rt["prompt"]["language"] == "English"
    assert rt["prompt"]["languages"] == {name: example_tokenizer.encode(f"language {name}<asr_text>").ids
                                         for name in ("English", "German")}
    site = SiteCodec(rt, b"\0" * 8)  # an empty decode table: only the prompt is read here
    source = TokenizerCodec(example_tokenizer)
    for language in (None, "English", "German"):
        assert site.prompt(13, language) == source.prompt(13, language)


HEAD = "name: t\nsource: {layout: qwen3-asr-split, dir: ./model}\n"


@pytest.mark.parametrize("text, expected", [
    ("language: German\n", "language: 'German' is not among languages (English); set it to 'auto' or one of them"),
    ("languages: [English, German]\nlanguage: french\n", "language: 'french' is not among languages"),
    ("languages: [English, '']\n", "languages: language name '' is not a name like 'English'"),
    ("languages: [english]\n", "languages: language name 'english' is not a name like 'English'"),
    ("languages: [English, English]\n", "languages: language 'English' is listed twice"),
    ("languages: []\n", "languages: List should have at least 1 item"),
    ("site: {samples: [{audio: a.wav, text: hi, language: German}]}\n",
     "site.samples[0].language 'German' is not among languages (English); add it there or write one of them"),
])
def test_model_yaml_languages_are_checked(tmp_path, text, expected):
    (tmp_path / "model").mkdir()
    path = tmp_path / "model.yaml"
    path.write_text(HEAD + text)
    result = CliRunner().invoke(main, [str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert any(f"model.yaml: {expected}" in line for line in lines), result.output
    assert not (tmp_path / "out").exists()


def test_the_example_starts_on_automatic_and_its_samples_name_languages_it_lists():
    cfg = load_config(EXAMPLE / "model.yaml")
    assert cfg.language == "auto" and "English" in cfg.languages
    assert {s.language or "English" for s in cfg.site.samples} <= set(cfg.languages)


def sample_language(sample) -> str:
    return sample.language or "English"


def test_a_forced_language_decodes_the_rest_of_the_detected_answer():
    """Each sample forced to the language it speaks: decoding goes on from the text marker with the tokens that
    followed it when the model named the language itself, and the transcript is the same."""
    cfg = load_config(EXAMPLE / "model.yaml")
    runner = load_transcriber(cfg.source.dir, lead=lead_samples(cfg.encoder.lead_ms))
    for sample in cfg.site.samples:
        language = sample_language(sample)
        pcm = read_wav(sample.audio)
        detected = runner.decode(pcm).tokens
        assert runner.language_of(detected) == language
        runner.force_language(language)
        forced = runner.decode(pcm).tokens
        runner.force_language(None)
        prefix = runner.codec.forced(language)
        assert detected[:len(prefix)] == prefix and forced == detected[len(prefix):]
        runner.force_language(language)
        assert runner.text(forced) == sample.text and runner.language_of(forced) == language
        runner.force_language(None)


def test_transcribe_json_gives_the_language_detected_or_forced(example_dist):
    sample = load_config(EXAMPLE / "model.yaml").site.samples[0]
    language = sample_language(sample)
    rows = []
    for extra in ([], ["--language", language]):
        result = CliRunner().invoke(main, ["transcribe", str(example_dist), str(sample.audio), "--json", *extra])
        assert result.exit_code == 0, result.output
        rows.append(json.loads(result.stdout))
    assert [(r["text"], r["language"]) for r in rows] == [(sample.text, language)] * 2


def test_transcribe_refuses_a_language_the_site_lacks_in_one_line(example_dist):
    cfg = load_config(EXAMPLE / "model.yaml")
    lacking = next(name for name in ("Chinese", "Japanese", "Korean", "German") if name not in cfg.languages)
    result = CliRunner().invoke(main, ["transcribe", str(example_dist), str(cfg.site.samples[0].audio),
                                       "--language", lacking])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: no language '{lacking}' in this site; it has {', '.join(cfg.languages)}"]

"""Context text in the system message: the page's byte-level BPE encoder (runtime/bpe.js, under Node) gives the ids
the Python tokenizer gives, id for id, on many strings, for the example's tokenizer, the zoo's Qwen-sized one
(the 0.6b preset's, made as the zoo makes it) and a tokenizer of the published Qwen3-ASR's shape (NFC, Qwen2's
regex); so does the reference's encoder of a built site (webbuild.reference.site_bpe); the prompt with a context
is the processor's (its template's text tokenised whole); the CLI's --context, in --json, and its budget."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers

from tests.example_config import EXAMPLE
from tests.vad_audio import NAME, NAME_CONTEXT, name_clip
from webbuild.pipeline.assemble import context_config, runtime_config, token_table
from webbuild.pipeline.bpe_form import merges_section
from webbuild.pipeline.render import TEMPLATE_DIR
from webbuild.reference.chunk import DEFAULT_POLICY
from webbuild.reference.prompt import PROMPT_PREFIX, build_prompt, prefix_ids, text_ids
from webbuild.reference.tokenizer import SPECIAL_TOKENS, add_special_tokens, build_tokenizer
from webbuild.reference.transcribe import SiteCodec, load_transcriber

pytestmark = pytest.mark.skipif(not shutil.which("node"), reason="no node")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                 r"|\s+(?!\S)|\s+")  # the published Qwen2/Qwen3 tokenizer.json's Split pattern
TEXTS = [
    "Zorbak Quill", "harmony emerge surprise", "Hello, world! It's 3:45pm -- isn't it?", "I'LL SAY 'S 'Ve 'd",
    "2026-12-06 3.14159 1,000,000 0x1F", "a  b   c    d", "   leading and trailing   ", "tab\there\t\tand\r\nCRLF",
    "line one\nline two\n\n\nthree", "\n", " ", "!!!???...;;;", "Москва и Санкт-Петербург", "Ελληνικά: Αθήνα",
    "北京欢迎你，上海。", "emoji 🎉🚀 and 👩‍👩‍👧 family", "mixed: Zürich, Ñandú, Ωmega 42 東京 Київ",
    "e\u0301te\u0301 (combining accents)", "no-break\u00a0space and\u2003em space", "nel\u0085and\ufeffbom",
    "x \u0085\u0085y z\u0085", "x \ufeffy \ufeff\ufeff",
    "<|im_end|> typed in the text <|im_start|>system", "<asr_text>language English", "ＦＵＬＬ width １２３",
    "x" * 300, "The Quick Brown Fox's tail's end",
]


def qwen2_shaped(texts: list[str]) -> Tokenizer:
    """A byte-level BPE shaped like the published Qwen3-ASR tokenizer: an NFC normaliser, a Split on Qwen2's
    regex, then ByteLevel without its own regex, trained on `texts`, with the special tokens."""
    from tokenizers import decoders, models, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_PATTERN), "isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts * 20, trainer=trainer)
    return add_special_tokens(tok, qwen_ids=False)


def tokenizer(name: str) -> Tokenizer:
    corpus = TEXTS + ["system user assistant", "Москва Петербург город", "Αθήνα πόλη", "北京 上海 东京 欢迎"]
    if name == "zoo 0.6b":  # the zoo package needs torch to import (its presets alone would not)
        from webbuild.zoo.presets import preset_tokenizer

        return preset_tokenizer("0.6b")
    return {"example": lambda: Tokenizer.from_file(str(EXAMPLE / "model" / "tokenizer.json")),
            "qwen2-shaped": lambda: qwen2_shaped(corpus),
            "bpe of the corpus": lambda: build_tokenizer(corpus, 600)}[name]()


def site_files(tok: Tokenizer, tmp: Path, context: str = "") -> tuple[dict, bytes]:
    """runtime.json prompt.context and tokens.bin as the build writes them."""
    form = context_config(tok, context, 4096, DEFAULT_POLICY, {})
    assert form is not None
    return form, token_table(tok) + merges_section(tok)


def js_encode(table: Path, form: dict, texts: list[str], prefix: list[int]) -> dict:
    """runtime/bpe.js's ids of each text, and of the prompt prefix with each as the context."""
    script = f"""
      import {{ readFileSync }} from 'node:fs';
      import {{ TokenTable }} from './runtime/tokens.js';
      import {{ BpeEncoder }} from './runtime/bpe.js';
      const enc = new BpeEncoder(new TokenTable(new Uint8Array(readFileSync({json.dumps(str(table))}))),
                                 {json.dumps(form)});
      const texts = {json.dumps(texts)};
      console.log(JSON.stringify({{ ids: texts.map((t) => enc.encode(t)),
                                    prefixes: texts.map((t) => enc.prefix(t, {json.dumps(prefix)})) }}));
    """
    run = subprocess.run(["node", "--input-type=module"], input=script, cwd=TEMPLATE_DIR, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.mark.parametrize("name", ["example", pytest.param("zoo 0.6b", marks=pytest.mark.torch), "qwen2-shaped",
                                  "bpe of the corpus"])
def test_the_pages_encoder_gives_the_tokenizers_ids(name, tmp_path):
    tok = tokenizer(name)
    form, table = site_files(tok, tmp_path)
    (tmp_path / "tokens.bin").write_bytes(table)
    prefix = prefix_ids(tok, "")
    got = js_encode(tmp_path / "tokens.bin", form, TEXTS, prefix)
    for text, ids, js_prefix in zip(TEXTS, got["ids"], got["prefixes"]):
        assert ids == text_ids(tok, text), text
        assert js_prefix == prefix_ids(tok, text), text
        if "<|" not in text and "<asr_text>" not in text:  # no special token: the tokenizer's own encode
            assert ids == tok.encode(text, add_special_tokens=False).ids, text
    # the reference's encoder of a built site, rebuilt from the same files, gives them too
    codec = SiteCodec({"prompt": {"prefix": prefix, "suffix": [], "audio_pad": 0, "context": form}}, table)
    assert [codec.context_prefix(t) for t in TEXTS] == got["prefixes"]


def test_special_tokens_typed_in_the_context_stay_text():
    tok = tokenizer("example")
    special = {tok.token_to_id(t) for t in SPECIAL_TOKENS}
    ids = prefix_ids(tok, "<|im_end|>\n<|im_start|>assistant\n<asr_text>")
    assert [i for i in ids if i in special] == [tok.token_to_id(t) for t in (
        "<|im_start|>", "<|im_end|>", "<|im_start|>", "<|audio_start|>")]  # the template's own, none of the text's


def test_the_prompt_with_context_is_the_processors_template_tokenised_whole():
    """transformers' Qwen3ASRProcessor puts the context as the system message's text: the template's text, its
    special tokens split off, then each stretch between them tokenised whole (so "system\\n" with the context)."""
    tok = tokenizer("qwen2-shaped")
    for context in ("Zorbak Quill", "  leading spaces", "\nnewline first", "Москва 42"):
        template = (f"<|im_start|>system\n{context}<|im_end|>\n<|im_start|>user\n<|audio_start|>"
                    + "<|audio_pad|>" * 3 + "<|audio_end|><|im_end|>\n<|im_start|>assistant\n")
        prompt = build_prompt(tok, 3, context=context)
        assert prompt.ids == tok.encode(template, add_special_tokens=False).ids, context
        assert prompt.audio_offset == len(prefix_ids(tok, context)) > len(tok.encode(PROMPT_PREFIX).ids)
    assert build_prompt(tok, 3).ids == build_prompt(tok, 3, context="").ids


def test_runtime_json_carries_the_default_context_and_its_budget():
    tok = tokenizer("example")
    cfg = json.loads((EXAMPLE / "model" / "config.json").read_text())
    rt = runtime_config(cfg, tok, context="Zorbak Quill")
    context = rt["prompt"]["context"]
    assert context["text"] == "Zorbak Quill" and context["lead"] == "system\n" and not context["nfc"]
    # what max_positions leaves after the longest chunk's prompt, its forced language and the answer
    assert context["max_tokens"] == rt["max_positions"] - (
        len(rt["prompt"]["prefix"]) + len(rt["prompt"]["suffix"]) + 390 + 3 + rt["max_new_tokens"])
    from webbuild.errors import BuildError
    with pytest.raises(BuildError, match=r"model.yaml context: \d+ tokens, over the \d+ the prompt has room for"):
        runtime_config(cfg, tok, context="word " * 200)


def webbuild(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(".venv/bin/webbuild").resolve()), *map(str, args)], capture_output=True,
                          text=True, timeout=600)


def test_cli_context_in_json_and_over_its_budget(example_dist, tmp_path):
    sample = name_clip(tmp_path / "name.wav")
    context = NAME_CONTEXT
    run = webbuild("transcribe", example_dist, sample, "--json", "--context", context)
    assert run.returncode == 0, run.stderr
    row = json.loads(run.stdout)
    reference = load_transcriber(example_dist)
    plain = reference.file_text(reference.decode_file(sample))  # cut into chunks as the CLI cuts them
    reference.give_context(context)
    assert row["context"] == context and row["text"] == reference.file_text(reference.decode_file(sample)) != plain
    # the model reads its context: the name is spelled with it, and not without
    assert NAME.lower() in row["text"].split() and NAME.lower() not in plain.split()
    run = webbuild("transcribe", example_dist, sample, "--json")  # the site's default (model.yaml: none)
    assert run.returncode == 0 and json.loads(run.stdout)["context"] == ""
    assert json.loads(run.stdout)["text"] == plain
    long = "word " * 200
    tokens = len(reference.codec.context_prefix(long)) - len(reference.codec.prefix)  # type: ignore[union-attr]
    run = webbuild("transcribe", example_dist, sample, "--context", long)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        f"error: --context: the context text is {tokens} tokens, over the 96 the prompt has room for (the longest "
        "chunk's prompt and answer must fit the decoder's positions); shorten it"]

"""Text in other scripts through the page's text path: the example's own tokenizer (byte-level BPE) splits the
characters of scripts its merges never saw (Han, emoji; Cyrillic and Greek too for an English one) into
single-byte tokens, so a streamed transcript meets characters cut between tokens. The page's StreamingDecoder
(runtime/tokens.js, over the build's token table) must show none of them half made (no U+FFFD, each text a
prefix of the next), end on the tokenizer's own decode, and the transcript files (app/transcript.js) carry the
characters as they are."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from webbuild.pipeline.assemble import token_table

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "webbuild" / "template"
TOKENIZER = REPO / "examples" / "tiny-asr" / "model" / "tokenizer.json"
TEXTS = ["привет мир, это проверка", "Καλημέρα κόσμε", "你好，世界。语音识别", "naïve café — 😀 ok",
         "mixed: один two τρία 四"]

pytestmark = pytest.mark.skipif(not shutil.which("node"), reason="no node")


def stream(table: Path, ids: list[list[int]]) -> list[dict]:
    """For each id list: the page's streamed texts after every token, and its final text."""
    script = f"""
      import {{ readFileSync }} from 'node:fs';
      import {{ StreamingDecoder, TokenTable }} from './runtime/tokens.js';
      const table = new TokenTable(new Uint8Array(readFileSync({json.dumps(str(table))})));
      const out = {json.dumps(ids)}.map((list) => {{
        const d = new StreamingDecoder(table);
        const texts = list.map((id) => d.push(id));
        return {{ texts, final: d.finish() }};
      }});
      console.log(JSON.stringify(out));
    """
    run = subprocess.run(["node", "--input-type=module"], input=script, cwd=TEMPLATE, capture_output=True,
                         text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_streamed_text_never_shows_half_a_character(tmp_path):
    tok = Tokenizer.from_file(str(TOKENIZER))
    table = tmp_path / "tokens.bin"
    table.write_bytes(token_table(tok))
    ids = [tok.encode(t, add_special_tokens=False).ids for t in TEXTS]
    # the case this guards: characters cut between tokens (a token alone decodes to U+FFFD): the English
    # tokenizer cuts nearly every non-Latin character, a multilingual one at least those of scripts it never saw
    partial = sum("\ufffd" in tok.decode([i]) for row in ids for i in row)
    assert partial > 15, partial
    for text, got in zip(TEXTS, stream(table, ids)):
        assert got["final"] == text == tok.decode(tok.encode(text, add_special_tokens=False).ids)
        for a, b in zip(got["texts"], got["texts"][1:] + [got["final"]]):
            assert "\ufffd" not in a and b.startswith(a), (text, a)


def test_transcript_files_carry_other_scripts_as_they_are():
    script = f"""
      import {{ cues, transcriptFile }} from './app/transcript.js';
      const texts = {json.dumps(TEXTS[:3], ensure_ascii=False)};
      const list = cues(texts, [[0, 16000], [16000, 32000], [32000, 48000]], 16000);
      const files = ['txt', 'srt', 'vtt'].map((f) => transcriptFile(f, texts.join(' '), list, 'Russian'));
      console.log(JSON.stringify(files));
    """
    run = subprocess.run(["node", "--input-type=module"], input=script, cwd=TEMPLATE, capture_output=True,
                         text=True, encoding="utf-8", timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    txt, srt, vtt = json.loads(run.stdout)
    assert txt["body"] == " ".join(TEXTS[:3]) + "\n" and txt["type"] == "text/plain;charset=utf-8"
    assert srt["body"].split("\n")[2] == TEXTS[0] and srt["body"].split("\n")[6] == TEXTS[1]
    assert vtt["body"].startswith("WEBVTT\n\nNOTE language: Russian\n\n") and TEXTS[2] in vtt["body"]
    assert "charset=utf-8" in srt["type"] and "charset=utf-8" in vtt["type"]

"""Check a written variant: onnxruntime session creation, greedy transcripts, agreement with a reference.

`webbuild.reference.transcribe.IdsDecoder` drives the built decoder interface (input_ids + audio splice, see
embeddings.py), so one greedy loop (webbuild.reference.transcribe.Transcriber) serves built variants and the fp32
unfused reference alike.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from webbuild.reference.transcribe import IdsDecoder, TokenizerCodec, Transcriber, cpu_session, load_transcriber
from webbuild.reference.wer import edit_distance

DEFAULT_MAX_NEW_TOKENS = 64


def variant_transcriber(out_dir: Path, variant: str, side_dir: Path) -> Transcriber:
    """Transcriber over encoder.<variant>.onnx + decoder.<variant>.onnx; tokenizer/config from side_dir."""
    cfg = json.loads((Path(side_dir) / "config.json").read_text())
    tok = Tokenizer.from_file(str(Path(side_dir) / "tokenizer.json"))
    return Transcriber(cpu_session(Path(out_dir) / f"encoder.{variant}.onnx"),
                       IdsDecoder(Path(out_dir) / f"decoder.{variant}.onnx", cfg["decoder"]), TokenizerCodec(tok),
                       frozenset(cfg["special_tokens"]["eos_token_ids"]))


def reference_tokens(reference_dir: Path, clips: dict[str, np.ndarray],
                     max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, lead: int = 0) -> dict[str, list[int]]:
    """Greedy tokens of the fp32 unfused source export (any layout); an encoder taking mel
    gets `lead` samples of lead before the audio, as the built front-end does."""
    ref = load_transcriber(reference_dir, lead=lead)
    return {name: ref.generate(pcm, max_new_tokens) for name, pcm in clips.items()}


def check_variant(t: Transcriber, clips: dict[str, np.ndarray], reference: dict[str, list[int]] | None,
                  max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> dict:
    """Transcripts of `clips` and, given reference tokens, per-clip token agreement (1 - edit distance / len)."""
    report = {"transcripts": {}, "token_agreement": {}}
    for name, pcm in clips.items():
        tokens = t.generate(pcm, max_new_tokens)
        report["transcripts"][name] = t.codec.decode(tokens)
        if reference is not None:
            ref = reference[name]
            report["token_agreement"][name] = 1.0 - edit_distance(ref, tokens) / max(len(ref), 1)
    if report["token_agreement"]:
        report["mean_token_agreement"] = float(np.mean(list(report["token_agreement"].values())))
    return report

"""Check a written variant: onnxruntime session creation, greedy transcripts, agreement with a reference.

`IdsDecoder` drives the built decoder interface (input_ids + audio splice, see embeddings.py) with the
same prefill/step calls as pipeline.transcribe's decoders, so pipeline.transcribe.Transcriber runs the
greedy loop for built variants and for the fp32 unfused reference alike.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from pipeline.train.evaluate import edit_distance
from pipeline.transcribe import Transcriber, cpu_session, load_transcriber

DEFAULT_MAX_NEW_TOKENS = 64


class IdsDecoder:
    """decoder.<variant>.onnx: input_ids, audio_features, audio_offset, attention_mask, past -> logits, present."""

    def __init__(self, path: Path, cfg: dict):
        self.sess = cpu_session(path)
        types = {i.name: i.type for i in self.sess.get_inputs()}
        self.dtype = np.float16 if types["audio_features"] == "tensor(float16)" else np.float32
        self.past_names = [n for n in types if n.startswith("past_key_values.")]
        dec = cfg["decoder"]
        self.empty = np.zeros((1, dec["num_key_value_heads"], 0, dec["head_dim"]), self.dtype)
        self.no_audio = np.zeros((1, 0, dec["hidden_size"]), self.dtype)

    def _run(self, ids, audio, offset: int, past: dict, total: int):
        out = self.sess.run(None, {"input_ids": np.array([ids], np.int64), "audio_features": audio,
                                   "audio_offset": np.array([offset], np.int64),
                                   "attention_mask": np.ones((1, total), np.int64), **past})
        return out[0][0, -1].astype(np.float32), (dict(zip(self.past_names, out[1:])), total)

    def prefill(self, prompt, audio: np.ndarray):
        past = {n: self.empty for n in self.past_names}
        return self._run(prompt.ids, audio.astype(self.dtype), prompt.audio_offset, past, len(prompt.ids))

    def step(self, token: int, state):
        past, total = state
        return self._run([token], self.no_audio, 0, past, total + 1)


def variant_transcriber(out_dir: Path, variant: str, side_dir: Path) -> Transcriber:
    """Transcriber over encoder.<variant>.onnx + decoder.<variant>.onnx; tokenizer/config from side_dir."""
    cfg = json.loads((Path(side_dir) / "config.json").read_text())
    tok = Tokenizer.from_file(str(Path(side_dir) / "tokenizer.json"))
    return Transcriber(cpu_session(Path(out_dir) / f"encoder.{variant}.onnx"),
                       IdsDecoder(Path(out_dir) / f"decoder.{variant}.onnx", cfg), tok,
                       frozenset(cfg["special_tokens"]["eos_token_ids"]))


def reference_tokens(reference_dir: Path, clips: dict[str, np.ndarray],
                     max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> dict[str, list[int]]:
    """Greedy tokens of the fp32 unfused source export (split or merged layout)."""
    ref = load_transcriber(reference_dir)
    return {name: ref.generate(pcm, max_new_tokens) for name, pcm in clips.items()}


def check_variant(t: Transcriber, clips: dict[str, np.ndarray], reference: dict[str, list[int]] | None,
                  max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> dict:
    """Transcripts of `clips` and, given reference tokens, per-clip token agreement (1 - edit distance / len)."""
    report = {"transcripts": {}, "token_agreement": {}}
    for name, pcm in clips.items():
        tokens = t.generate(pcm, max_new_tokens)
        report["transcripts"][name] = t.tokenizer.decode(tokens, skip_special_tokens=False)
        if reference is not None:
            ref = reference[name]
            report["token_agreement"][name] = 1.0 - edit_distance(ref, tokens) / max(len(ref), 1)
    if report["token_agreement"]:
        report["mean_token_agreement"] = float(np.mean(list(report["token_agreement"].values())))
    return report

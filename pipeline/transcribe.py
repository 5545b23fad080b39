"""Reference transcription in Python with onnxruntime: mel -> encoder -> greedy decoding.

Model folders are recognised by their files: the split layout (decoder_init + decoder_step) and the
merged layout (decoder_model_merged.onnx). Every decoder exposes the same two calls, `prefill` and
`step`, so the greedy loop is written once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from pipeline.mel import log_mel
from pipeline.prompt import Prompt, audio_token_count, build_prompt, parse_answer

DEFAULT_MAX_NEW_TOKENS = 200


class ModelDirError(Exception):
    pass


def cpu_session(path: Path) -> ort.InferenceSession:
    """An onnxruntime CPU session that logs only errors."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _embed_table(model_dir: Path, cfg: dict) -> np.ndarray:
    dtype = np.dtype(cfg.get("embed_tokens_dtype", "float32"))
    shape = cfg.get("embed_tokens_shape") or [cfg["decoder"]["vocab_size"], cfg["decoder"]["hidden_size"]]
    return np.memmap(model_dir / "embed_tokens.bin", dtype=dtype, mode="r", shape=tuple(shape))


class SplitDecoder:
    """decoder_init (prefill with the audio splice) + decoder_step (one token, stacked KV)."""

    def __init__(self, model_dir: Path, cfg: dict):
        self.init = cpu_session(model_dir / "decoder_init.onnx")
        self.step_sess = cpu_session(model_dir / "decoder_step.onnx")
        self.embed = _embed_table(model_dir, cfg)

    def prefill(self, prompt: Prompt, audio: np.ndarray):
        n = len(prompt.ids)
        logits, keys, values = self.init.run(None, {
            "input_ids": np.array([prompt.ids], np.int64), "position_ids": np.arange(n, dtype=np.int64)[None],
            "audio_features": audio, "audio_offset": np.array([prompt.audio_offset], np.int64)})
        return logits[0, -1], (keys, values, n)

    def step(self, token: int, state):
        keys, values, pos = state
        logits, keys, values = self.step_sess.run(None, {
            "input_embeds": np.asarray(self.embed[[token]], np.float32)[None],
            "position_ids": np.array([[pos]], np.int64), "past_keys": keys, "past_values": values})
        return logits[0, -1], (keys, values, pos + 1)


class MergedDecoder:
    """optimum-style decoder: inputs_embeds + attention_mask + per-layer past -> logits + present."""

    def __init__(self, model_dir: Path, cfg: dict, graph: str = "decoder_model_merged.onnx"):
        self.sess = cpu_session(model_dir / graph)
        self.embed = _embed_table(model_dir, cfg)
        self.past_names = [i.name for i in self.sess.get_inputs() if i.name.startswith("past_key_values.")]
        dec = cfg["decoder"]
        self.empty = np.zeros((1, dec["num_key_value_heads"], 0, dec["head_dim"]), np.float32)

    def _run(self, x: np.ndarray, past: dict, total: int):
        out = self.sess.run(None, {"inputs_embeds": x, "attention_mask": np.ones((1, total), np.int64), **past})
        return out[0][0, -1], (dict(zip(self.past_names, out[1:])), total)

    def prefill(self, prompt: Prompt, audio: np.ndarray):
        x = np.asarray(self.embed[prompt.ids], np.float32)[None].copy()
        x[0, prompt.audio_offset:prompt.audio_offset + prompt.audio_tokens] = audio[0]
        return self._run(x, {n: self.empty for n in self.past_names}, len(prompt.ids))

    def step(self, token: int, state):
        past, total = state
        return self._run(np.asarray(self.embed[[token]], np.float32)[None], past, total + 1)


@dataclass
class Transcriber:
    encoder: ort.InferenceSession
    decoder: SplitDecoder | MergedDecoder
    tokenizer: Tokenizer
    eos_ids: frozenset[int]

    def audio_features(self, pcm: np.ndarray) -> np.ndarray:
        # built encoders carry the mel front-end in the graph and take PCM directly
        if self.encoder.get_inputs()[0].name == "pcm":
            return self.encoder.run(None, {"pcm": np.asarray(pcm, np.float32)[None]})[0]
        return self.encoder.run(None, {"mel": log_mel(pcm)[None]})[0]

    def generate(self, pcm: np.ndarray, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> list[int]:
        audio = self.audio_features(pcm)
        prompt = build_prompt(self.tokenizer, audio.shape[1])
        if audio.shape[1] != audio_token_count(len(pcm) // 160):
            raise RuntimeError(f"encoder gave {audio.shape[1]} audio tokens, expected "
                               f"{audio_token_count(len(pcm) // 160)}")
        logits, state = self.decoder.prefill(prompt, audio)
        tokens: list[int] = []
        for _ in range(max_new_tokens):
            token = int(np.argmax(logits))
            if token in self.eos_ids:
                break
            tokens.append(token)
            logits, state = self.decoder.step(token, state)
        return tokens

    def transcribe(self, pcm: np.ndarray, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> str:
        ids = self.generate(pcm, max_new_tokens)
        return parse_answer(self.tokenizer.decode(ids, skip_special_tokens=False))


def load_transcriber(model_dir: Path) -> Transcriber:
    """A Transcriber for a source export folder (split or merged layout)."""
    model_dir = Path(model_dir)
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise ModelDirError(f"{model_dir}: no config.json; pass a model folder (split or merged layout)")
    cfg = json.loads(cfg_path.read_text())
    if (model_dir / "decoder_init.onnx").is_file():
        decoder = SplitDecoder(model_dir, cfg)
    elif (model_dir / "decoder_model_merged.onnx").is_file():
        decoder = MergedDecoder(model_dir, cfg)
    elif (model_dir / "decoder.onnx").is_file():  # fused decoder of a build, same interface
        decoder = MergedDecoder(model_dir, cfg, graph="decoder.onnx")
    else:
        raise ModelDirError(f"{model_dir}: found none of decoder_init.onnx (split layout), "
                            "decoder_model_merged.onnx (merged layout), decoder.onnx (built model)")
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    eos = frozenset(cfg["special_tokens"]["eos_token_ids"])
    return Transcriber(cpu_session(model_dir / "encoder.onnx"), decoder, tok, eos)

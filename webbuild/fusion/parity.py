"""Parity harness: greedy decoding on onnxruntime CPU, source graphs vs the fused decoder.

A prefill of random embeddings, then decode steps fed with the embedding of the greedy token.
Each runner keeps its own KV cache and returns last-position logits, so split (init + step),
merged and fused graphs are driven the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort

from webbuild.graph import cpu_session as cpu
from webbuild.site.contract import IO


def _session(path: Path, config: dict[str, str] | None = None) -> ort.InferenceSession:
    return cpu.session(str(path), cpu.options(config))


class SplitRunner:
    """decoder_init (embeddings fed through audio_features at offset 0) + decoder_step."""

    def __init__(self, src: Path):
        self.init, self.step_s = _session(src / "decoder_init.onnx"), _session(src / "decoder_step.onnx")
        self.kv: tuple[np.ndarray, np.ndarray] | None = None
        self.pos = 0

    def prefill(self, embeds: np.ndarray) -> np.ndarray:
        b, s, _ = embeds.shape
        logits, k, v = self.init.run(None, {
            "input_ids": np.zeros((b, s), np.int64), "position_ids": np.arange(s, dtype=np.int64)[None].repeat(b, 0),
            "audio_features": embeds, "audio_offset": np.zeros(1, np.int64)})
        self.kv, self.pos = (k, v), s
        return logits[:, -1]

    def step(self, embed: np.ndarray) -> np.ndarray:
        b = embed.shape[0]
        assert self.kv is not None, "prefill first"
        logits, k, v = self.step_s.run(None, {
            "input_embeds": embed, "position_ids": np.full((b, 1), self.pos, np.int64),
            "past_keys": self.kv[0], "past_values": self.kv[1]})
        self.kv, self.pos = (k, v), self.pos + 1
        return logits[:, -1]


class MergedRunner:
    """inputs_embeds / attention_mask / past_key_values.{i}.* -> logits, present.{i}.* (source or fused)."""

    def __init__(self, path: Path, kv_dims: tuple[int, int] | None = None, config: dict[str, str] | None = None):
        """`kv_dims` (kv heads, head dim) for graphs that declare them symbolically; `config`:
        onnxruntime session config entries."""
        self.sess = _session(path, config)
        self.kv_dims = kv_dims
        self.presents = IO.present_of_past([i.name for i in self.sess.get_inputs()])
        self.past_names = list(self.presents)
        self.shapes = {i.name: i.shape for i in self.sess.get_inputs()}
        self.out_names = [o.name for o in self.sess.get_outputs()]
        self.past: dict[str, np.ndarray] | None = None

    def _run(self, embeds: np.ndarray) -> np.ndarray:
        b, s, _ = embeds.shape
        past_len = 0 if self.past is None else next(iter(self.past.values())).shape[2]
        feeds = {IO.inputs_embeds: embeds, IO.attention_mask: np.ones((b, past_len + s), np.int64)}
        for name in self.past_names:
            feeds[name] = self.past[name] if self.past else np.zeros((b, *self._kv_dims(name)[:1], 0,
                                                                         self._kv_dims(name)[1]), np.float32)
        outs = dict(zip(self.out_names, self.sess.run(None, feeds)))
        self.past = {n: outs[present] for n, present in self.presents.items()}
        return outs[IO.logits][:, -1]

    def _kv_dims(self, name: str) -> tuple[int, int]:
        _, kv, _, hd = self.shapes[name]
        if isinstance(kv, int) and isinstance(hd, int):
            return kv, hd
        if self.kv_dims is None:
            raise ValueError(f"{name}: symbolic KV shape {self.shapes[name]}; pass kv_dims")
        return self.kv_dims

    prefill = step = _run


class StaticRunner:
    """A decoder over static KV buffers: every past input [B, kv, L, hd] of fixed length L, fed back its present
    (the same length), attention_mask [B, L] with ones on the written slots, the new ones included; position_ids
    when it takes them. Drives a source writing the buffers by ScatterND and the GroupQueryAttention it fuses to
    alike. The slots not yet written start as seeded noise (`stale`): the mask must hide them."""

    def __init__(self, path: Path, stale: int = 0, length: int | None = None):
        """`length`: the buffers' length, for graphs that leave it symbolic."""
        self.sess = _session(path)
        inputs = {i.name: i for i in self.sess.get_inputs()}
        self.presents = IO.present_of_past(list(inputs))
        self.shapes = {n: inputs[n].shape for n in self.presents}
        declared = next(iter(self.shapes.values()))[2]
        self.length = declared if isinstance(declared, int) else length
        if self.length is None:
            raise ValueError(f"{path}: past inputs of symbolic length {declared}; pass length")
        self.position_ids = "position_ids" in inputs
        self.out_names = [o.name for o in self.sess.get_outputs()]
        self.rng = np.random.default_rng(stale)
        self.past: dict[str, np.ndarray] | None = None
        self.written = 0  # slots written so far

    def _run(self, embeds: np.ndarray) -> np.ndarray:
        b, s, _ = embeds.shape
        assert self.length is not None, "set in __init__"
        if self.past is None:
            self.past = {n: self.rng.standard_normal((b, kv, self.length, hd)).astype(np.float32)
                         for n, (_, kv, _, hd) in self.shapes.items()}
        mask = (np.arange(self.length) < self.written + s).astype(np.int64)[None].repeat(b, 0)
        feeds = {IO.inputs_embeds: embeds, IO.attention_mask: mask, **self.past}
        if self.position_ids:
            feeds["position_ids"] = np.arange(self.written, self.written + s, dtype=np.int64)[None].repeat(b, 0)
        outs = dict(zip(self.out_names, self.sess.run(None, feeds)))
        self.past = {n: outs[present] for n, present in self.presents.items()}
        self.written += s
        return outs[IO.logits][:, -1]

    prefill = step = _run


def embed_table(src_dir: Path) -> np.ndarray:
    cfg = json.loads((src_dir / "config.json").read_text())
    return np.fromfile(src_dir / "embed_tokens.bin", dtype=cfg.get("embed_tokens_dtype", "float32")).reshape(
        cfg["embed_tokens_shape"]).astype(np.float32)


def greedy(runner, embeds: np.ndarray, table: np.ndarray, steps: int) -> tuple[list[np.ndarray], list[int]]:
    """Last-position logits of the prefill and each step, and the greedy tokens (batch 0)."""
    logits = [runner.prefill(embeds)]
    tokens = [int(logits[-1][0].argmax())]
    for _ in range(steps):
        logits.append(runner.step(table[tokens[-1]][None, None].repeat(embeds.shape[0], 0)))
        tokens.append(int(logits[-1][0].argmax()))
    return logits, tokens


def compare(src_runner, fused_runner, table: np.ndarray, prefill: int = 10, steps: int = 5, seed: int = 0) -> dict:
    """Max relative logit error (|a-b| / range of a, per step) and whether greedy tokens agree."""
    rng = np.random.default_rng(seed)
    embeds = rng.standard_normal((1, prefill, table.shape[1])).astype(np.float32)
    return compare_runs(src_runner, fused_runner, embeds, table, steps)


def source_runner(src: Path):
    src = Path(src)
    if src.is_dir() and (src / "decoder_init.onnx").is_file():
        return SplitRunner(src)
    return MergedRunner(src / "decoder_model_merged.onnx" if src.is_dir() else src)


class TokenRunner:
    """A decoder that takes token ids (`input_ids`, `attention_mask`, `position_ids` when it has it,
    `past_key_values.{i}.key|value`), as Optimum's text-generation-with-past exports do; the same
    feeds serve the fused graph, whose GQA derives positions from the mask and ignores position_ids."""

    def __init__(self, path: Path):
        self.sess = _session(path)
        self.inputs = {i.name: i for i in self.sess.get_inputs()}
        self.presents = IO.present_of_past(list(self.inputs))
        self.past_names = list(self.presents)
        self.out_names = [o.name for o in self.sess.get_outputs()]
        self.past: dict[str, np.ndarray] | None = None

    def _run(self, ids: np.ndarray) -> np.ndarray:
        b, s = ids.shape
        past_len = 0 if self.past is None else next(iter(self.past.values())).shape[2]
        feeds = {IO.input_ids: ids, IO.attention_mask: np.ones((b, past_len + s), np.int64)}
        if "position_ids" in self.inputs:
            feeds["position_ids"] = np.arange(past_len, past_len + s, dtype=np.int64)[None].repeat(b, 0)
        for name in self.past_names:
            _, kv, _, hd = self.inputs[name].shape
            half = self.inputs[name].type == "tensor(float16)"  # an fp16 graph's own past (transformers.js')
            feeds[name] = self.past[name] if self.past else np.zeros((b, kv, 0, hd), np.float16 if half else np.float32)
        outs = dict(zip(self.out_names, self.sess.run(None, feeds)))
        self.past = {n: outs[present] for n, present in self.presents.items()}
        return outs[IO.logits][:, -1].astype(np.float32)

    prefill = step = _run


def compare_tokens(src: Path, fused: Path, vocab: int, prefill: int = 10, steps: int = 16, seed: int = 0) -> dict:
    """`compare` for token-id decoders: a random prompt, then `steps` greedy steps with the KV cache."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, vocab, (1, prefill), dtype=np.int64)
    ids = np.arange(vocab, dtype=np.int64)  # greedy() feeds table[token][None, None]: the token as [1, 1]
    return compare_runs(TokenRunner(src), TokenRunner(fused), prompt, ids, steps)


def compare_runs(src_runner, fused_runner, first: np.ndarray, table: np.ndarray, steps: int) -> dict:
    """Greedy decoding of both runners from the same first input; max relative logit error (|a-b| /
    range of a, per step) and whether the greedy tokens agree."""
    a, ta = greedy(src_runner, first, table, steps)
    b, tb = greedy(fused_runner, first, table, steps)
    rel = [float(np.abs(x - y).max() / (x.max() - x.min())) for x, y in zip(a, b)]
    return {"max_rel_err": max(rel), "per_step_rel_err": rel, "tokens_source": ta, "tokens_fused": tb,
            "tokens_equal": ta == tb}

"""The Qwen3-ASR chat prompt and answer format, and the audio-token arithmetic."""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Tokenizer

from webbuild.errors import SourceError

PROMPT_PREFIX = "<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|audio_start|>"
PROMPT_SUFFIX = "<|audio_end|><|im_end|>\n<|im_start|>assistant\n"
ANSWER_PREFIX = "language English<asr_text>"
ANSWER_END = "<|im_end|>"

MEL_FRAMES_PER_CHUNK = 100  # 2 * n_window; 1 s of audio
TOKENS_PER_CHUNK = 13


def audio_token_count(mel_frames: int) -> int:
    """Audio tokens the encoder emits for `mel_frames` frames (13 per full 100-frame chunk)."""
    full, rest = divmod(mel_frames, MEL_FRAMES_PER_CHUNK)
    tail = rest
    for _ in range(3):  # three stride-2 convolutions, kernel 3, padding 1
        tail = (tail - 1) // 2 + 1 if tail > 0 else 0
    return full * TOKENS_PER_CHUNK + tail


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    audio_offset: int  # index of the first <|audio_pad|>
    audio_tokens: int


def build_prompt(tok: Tokenizer, audio_tokens: int) -> Prompt:
    """Token ids of the transcription prompt with `audio_tokens` audio placeholders."""
    pad = tok.token_to_id("<|audio_pad|>")
    if pad is None:  # else the prompt would carry None ids, which onnxruntime rejects far from here
        raise SourceError("the tokenizer has no <|audio_pad|> token: not a Qwen3-ASR tokenizer")
    prefix = tok.encode(PROMPT_PREFIX, add_special_tokens=False).ids
    suffix = tok.encode(PROMPT_SUFFIX, add_special_tokens=False).ids
    return Prompt(prefix + [pad] * audio_tokens + suffix, len(prefix), audio_tokens)


def answer_text(text: str) -> str:
    """The assistant's full answer for transcript `text` (training target)."""
    return f"{ANSWER_PREFIX}{text}{ANSWER_END}"


def parse_answer(decoded: str) -> str:
    """The transcript inside a decoded answer (drops the language tag and end token)."""
    text = decoded.split("<asr_text>", 1)[1] if "<asr_text>" in decoded else decoded
    return text.replace(ANSWER_END, "").replace("<|endoftext|>", "").strip()

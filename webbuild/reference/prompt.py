"""The Qwen3-ASR chat prompt and answer format, and the audio-token arithmetic."""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Tokenizer

from webbuild.errors import SourceError
from webbuild.reference.mel import HOP, SAMPLE_RATE

# The system message carries the context text (names, terms) as Qwen3-ASR's processor places it
# (transformers Qwen3ASRProcessor.apply_transcription_request: prompt= is the system message's content).
SYSTEM_START = "<|im_start|>"
SYSTEM_LEAD = "system\n"  # tokenised with the context: the processor tokenises "system\n{CONTEXT}" as one text
SYSTEM_END = "<|im_end|>\n<|im_start|>user\n<|audio_start|>"
PROMPT_PREFIX = f"{SYSTEM_START}{SYSTEM_LEAD}{SYSTEM_END}"
PROMPT_SUFFIX = "<|audio_end|><|im_end|>\n<|im_start|>assistant\n"
ANSWER_END = "<|im_end|>"
TEXT_START = "<asr_text>"
LANGUAGE_TAG = "language "  # the answer opens with `language <Name>` then TEXT_START
DEFAULT_LANGUAGES = ("English",)


def answer_prefix(language: str) -> str:
    """The answer's opening for `language`: decoding forced to start after it transcribes in that language."""
    return f"{LANGUAGE_TAG}{language}{TEXT_START}"


ANSWER_PREFIX = answer_prefix("English")

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


def language_ids(tok: Tokenizer, language: str) -> list[int]:
    """The ids of `language`'s forced answer prefix (runtime.json prompt.languages)."""
    return tok.encode(answer_prefix(language), add_special_tokens=False).ids


def text_ids(tok: Tokenizer, text: str) -> list[int]:
    """`text` through the tokenizer's normaliser, pre-tokeniser and BPE model only: special tokens written in it
    are read as plain text (a visitor's context cannot end the system message). For text without them this is
    `tok.encode(text, add_special_tokens=False)`; runtime/bpe.js encodes the same way."""
    normalised = tok.normalizer.normalize_str(text) if tok.normalizer is not None else text
    pieces = tok.pre_tokenizer.pre_tokenize_str(normalised) if tok.pre_tokenizer is not None else [(normalised, None)]
    return [t.id for piece, _ in pieces for t in tok.model.tokenize(piece)]


def prefix_ids(tok: Tokenizer, context: str = "") -> list[int]:
    """The prompt's ids before the audio, the context text in the system message (empty: PROMPT_PREFIX's ids)."""
    if not context:
        return tok.encode(PROMPT_PREFIX, add_special_tokens=False).ids
    return (tok.encode(SYSTEM_START, add_special_tokens=False).ids + text_ids(tok, SYSTEM_LEAD + context)
            + tok.encode(SYSTEM_END, add_special_tokens=False).ids)


def build_prompt(tok: Tokenizer, audio_tokens: int, language: str | None = None, context: str = "") -> Prompt:
    """Token ids of the transcription prompt with `audio_tokens` audio placeholders, `context` in the system
    message; with `language`, its answer prefix after them (the assistant turn already begun), so that decoding
    goes on from the text."""
    pad = tok.token_to_id("<|audio_pad|>")
    if pad is None:  # else the prompt would carry None ids, which onnxruntime rejects far from here
        raise SourceError("the tokenizer has no <|audio_pad|> token: not a Qwen3-ASR tokenizer")
    prefix = prefix_ids(tok, context)
    suffix = tok.encode(PROMPT_SUFFIX, add_special_tokens=False).ids
    forced = language_ids(tok, language) if language is not None else []
    return Prompt(prefix + [pad] * audio_tokens + suffix + forced, len(prefix), audio_tokens)


def answer_text(text: str, language: str = "English") -> str:
    """The assistant's full answer for transcript `text` spoken in `language` (training target)."""
    return f"{answer_prefix(language)}{text}{ANSWER_END}"


def parse_answer(decoded: str) -> str:
    """The transcript inside a decoded answer (drops the language tag and end token)."""
    text = decoded.split(TEXT_START, 1)[1] if TEXT_START in decoded else decoded
    return text.replace(ANSWER_END, "").replace("<|endoftext|>", "").strip()


def parse_language(decoded: str) -> str | None:
    """The language a decoded answer names (`language <Name><asr_text>...`); None where it names none
    (Qwen3-ASR answers `language None` where it hears no speech)."""
    if not decoded.startswith(LANGUAGE_TAG) or TEXT_START not in decoded:
        return None
    name = decoded[len(LANGUAGE_TAG):decoded.index(TEXT_START)].strip()
    return name if name and name != "None" else None


# an answer's tokens at most (runtime.json max_new_tokens, the reference's default)
DEFAULT_MAX_NEW_TOKENS = 200


def context_tokens(positions: int, prompt_text_tokens: int, chunk_seconds: float, forced_tokens: int) -> int:
    """The context text's budget: the positions max_positions leaves to spare after the longest chunk's prompt,
    its longest forced language and max_new_tokens, so that every chunk still fits the captured decode's static
    KV cache (a longer prompt would push the longest chunks to plain, slower decoding)."""
    audio = audio_token_count(int(chunk_seconds * SAMPLE_RATE) // HOP)
    return positions - (prompt_text_tokens + audio + forced_tokens + DEFAULT_MAX_NEW_TOKENS)


def max_positions(prompt_text_tokens: int, chunk_seconds: float) -> int:
    """Positions a chunk can reach: its prompt around the longest chunk's audio, then max_new_tokens;
    rounded up to a multiple of 64 with 64 to spare. The captured decode's static KV cache has this
    many (runtime/capture.js); a chunk that would not fit decodes plainly."""
    audio = audio_token_count(int(chunk_seconds * SAMPLE_RATE) // HOP)
    need = prompt_text_tokens + audio + DEFAULT_MAX_NEW_TOKENS + 64
    return -(-need // 64) * 64

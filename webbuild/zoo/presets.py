"""Model-zoo presets: Qwen3-ASR configurations built from the upstream `transformers` classes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

from webbuild.reference.tokenizer import build_tokenizer

# Encoder/decoder dimensions. 0.6b and 1.7b follow the published Qwen3-ASR checkpoints.
_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        audio=dict(d_model=192, encoder_layers=4, encoder_attention_heads=4, encoder_ffn_dim=768,
                   downsample_hidden_size=32),
        text=dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, max_position_embeddings=2048),
        bpe_vocab_size=1024, qwen_ids=False,
    ),
    "0.6b": dict(
        audio=dict(d_model=896, encoder_layers=18, encoder_attention_heads=14, encoder_ffn_dim=3584,
                   downsample_hidden_size=480),
        text=dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128, max_position_embeddings=65536),
        bpe_vocab_size=4096, qwen_ids=True,
    ),
    "1.7b": dict(
        audio=dict(d_model=1024, encoder_layers=24, encoder_attention_heads=16, encoder_ffn_dim=4096,
                   downsample_hidden_size=480),
        text=dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128, max_position_embeddings=65536),
        bpe_vocab_size=4096, qwen_ids=True,
    ),
}
PRESET_NAMES = tuple(_PRESETS)


@dataclass(frozen=True)
class Preset:
    name: str
    audio: dict
    text: dict
    bpe_vocab_size: int
    qwen_ids: bool  # special tokens at the published Qwen ids (vocab 151936)


def get_preset(name: str) -> Preset:
    if name not in _PRESETS:
        raise KeyError(f"unknown preset {name!r}; choose one of {', '.join(PRESET_NAMES)}")
    return Preset(name=name, **_PRESETS[name])


def make_config(preset: Preset, vocab_size: int, special: dict[str, int]):
    """A `Qwen3ASRConfig` for `preset` with the tokenizer's vocabulary and special-token ids."""
    from transformers import Qwen3ASRConfig

    text = dict(preset.text, vocab_size=vocab_size, tie_word_embeddings=True, rms_norm_eps=1e-6,
                rope_theta=1_000_000.0)
    audio = dict(preset.audio, num_mel_bins=128, n_window=50, n_window_infer=800,
                 output_dim=preset.text["hidden_size"])
    eos = (special["<|endoftext|>"], special["<|im_end|>"])
    return Qwen3ASRConfig(
        audio_config=audio,
        text_config=text,
        audio_token_id=special["<|audio_pad|>"],
        pad_token_id=special["<|endoftext|>"],
        eos_token_id=eos,
        tie_word_embeddings=True,
    )


# Text the zoo's own tokenizers learn their merges from: the words of the prompt and of everyday
# English, so encoding stays short; presets need a tokenizer, not a good one.
_CORPUS = (
    "system user assistant language English "
    "the of and to in is you that it he was for on are as with his they at be this have from or one "
    "had by word but not what all were we when your can said there use an each which she do how their "
    "if will up other about out many then them these so some her would make like him into time has look "
    "two more write go see number no way could people my than first water been call who oil its now find "
    "long down day did get come made may part over new sound take only little work know place year live "
    "me back give most very after thing our just name good sentence man think say great where help through "
    "much before line right too mean old any same tell boy follow came want show also around form three "
    "small set put end does another well large must big even such because turn here why ask went men read "
    "need land different home us move try kind hand picture again change off play spell air away animal "
    "house point page letter mother answer found study still learn should world high every near add food "
    "between own below country plant last school father keep tree never start city earth eye light thought"
)


def preset_tokenizer(preset_name: str) -> Tokenizer:
    """The tokenizer a preset's model is made with (the same for every seed)."""
    preset = get_preset(preset_name)
    return build_tokenizer([_CORPUS] * 4, preset.bpe_vocab_size, qwen_ids=preset.qwen_ids)

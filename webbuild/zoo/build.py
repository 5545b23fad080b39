"""Make zoo models: a preset with random weights, or a trained checkpoint, ready for export."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from tokenizers import Tokenizer

from webbuild.errors import SourceError
from webbuild.reference.tokenizer import QWEN_VOCAB_SIZE, special_ids
from webbuild.zoo.presets import get_preset, make_config, preset_tokenizer


def random_model(preset_name: str, seed: int = 0):
    """(model, tokenizer) for a preset with random weights drawn from `seed`."""
    from transformers import Qwen3ASRForConditionalGeneration

    preset = get_preset(preset_name)
    tok = preset_tokenizer(preset_name)
    vocab = QWEN_VOCAB_SIZE if preset.qwen_ids else tok.get_vocab_size()
    torch.manual_seed(seed)
    model = Qwen3ASRForConditionalGeneration(make_config(preset, vocab, special_ids(tok)))
    return model.eval(), tok


def load_checkpoint(ckpt_dir: Path):
    """(model, tokenizer) from a `save_pretrained` folder holding tokenizer.json beside it."""
    from transformers import Qwen3ASRForConditionalGeneration

    ckpt_dir = Path(ckpt_dir)
    tok_path = ckpt_dir / "tokenizer.json"
    if not tok_path.is_file():
        raise SourceError(f"{tok_path}: missing; a checkpoint folder needs its tokenizer.json")
    model = Qwen3ASRForConditionalGeneration.from_pretrained(str(ckpt_dir), dtype=torch.float32)
    return model.eval(), Tokenizer.from_file(str(tok_path))


def save_text_decoder_hf(model, tok: Tokenizer, hf_dir: Path) -> None:
    """The text decoder as a Hugging Face `Qwen3ForCausalLM` folder (for onnxruntime-genai's builder).
    It wraps the model's own decoder module, so no second copy of the weights is made."""
    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):
        lm = Qwen3ForCausalLM(copy.deepcopy(model.config.text_config))
    lm.model = model.model.language_model
    lm.lm_head.weight = lm.model.embed_tokens.weight
    lm.config.tie_word_embeddings = True
    ids = special_ids(tok)
    lm.config.bos_token_id = ids["<|endoftext|>"]
    lm.config.eos_token_id = [ids["<|endoftext|>"], ids["<|im_end|>"]]
    lm.save_pretrained(str(hf_dir))
    tok.save(str(Path(hf_dir) / "tokenizer.json"))
    (Path(hf_dir) / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
    }, indent=2) + "\n")

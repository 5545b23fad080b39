"""torch.onnx's dynamo exports of Hugging Face CausalLMs (this venv's torch and transformers): the families of
optimum_export.py (same configs, same random weights), called with explicit position ids and a DynamicCache
seeded from the past inputs, exported in Optimum's interface (input_ids, attention_mask, past_key_values.{i}.*
-> logits, present.{i}.*) at a chosen opset and attention implementation ("eager": decomposed; "sdpa": torch's
fused op, which opset 23 exports as the standard Attention)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

CASES = [(f, "eager", 18) for f in ("gemma3", "smollm3", "cohere", "glm", "phi", "stablelm", "nemotron",
                                     "gemma2-softcap")]
CASES += [(f, "sdpa", 23) for f in ("gemma3", "glm", "phi")]


def cached(zoo, family: str, attention: str, opset: int) -> Path:
    """`export`'s folder, made once into the zoo's cache (tests/conftest.py Zoo) under a key of this file and
    of optimum_export.py."""
    import hashlib

    from tests.fusion import optimum_export

    key = hashlib.sha256(b"".join(Path(f).read_bytes() for f in (__file__, optimum_export.__file__)))
    return zoo.made(f"hf-dynamo-{family}-{attention}-opset{opset}-{key.hexdigest()[:12]}",
                    lambda out: export(family, out, attention, opset))


def export(family: str, out: Path, attention: str = "eager", opset: int = 18) -> Path:
    """A folder with model.onnx and the model's config.json."""
    import torch
    import transformers as tf

    from tests.fusion import optimum_export

    with tempfile.TemporaryDirectory() as tmp:
        optimum_export.build(family, Path(tmp))
        model = getattr(tf, optimum_export.FAMILIES[family][1]).from_pretrained(tmp, attn_implementation=attention)
        out.mkdir(parents=True)
        shutil.copy(Path(tmp) / "config.json", out / "config.json")
    cfg = model.config
    layers = cfg.num_hidden_layers
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    names = [f"past_key_values.{i}.{n}" for i in range(layers) for n in ("key", "value")]
    args = (torch.randint(0, cfg.vocab_size, (1, 3)), torch.ones(1, 9, dtype=torch.int64),
            *[torch.randn(1, cfg.num_key_value_heads, 6, hd) for _ in names])
    dyn = torch.export.Dim.DYNAMIC
    with torch.no_grad():
        torch.onnx.export(_wrapper(model.eval(), layers), args, str(out / "model.onnx"), dynamo=True,
                          input_names=["input_ids", "attention_mask", *names],
                          output_names=["logits", *(n.replace("past_key_values", "present") for n in names)],
                          dynamic_shapes=({0: dyn, 1: dyn}, {0: dyn, 1: dyn}, tuple({0: dyn, 2: dyn} for _ in names)),
                          opset_version=opset, external_data=False, optimize=True, verbose=False)
    return out


def _wrapper(model, layers: int):
    """forward(input_ids, attention_mask, *past) -> (logits, *presents), the cache rebuilt from the past."""
    import torch
    from transformers.cache_utils import DynamicCache

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, input_ids, attention_mask, *past):
            cache = DynamicCache()
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            pos = (torch.arange(input_ids.shape[1]) + past[0].shape[2]).unsqueeze(0)
            o = self.m(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, past_key_values=cache,
                       use_cache=True)
            return (o.logits, *(t for layer in o.past_key_values.layers for t in (layer.keys, layer.values)))

    return Wrapper().eval()

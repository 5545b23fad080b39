"""The fused decoder's interface (the site runtime is written against these names)."""

from __future__ import annotations


def merged_names(n_layers: int) -> tuple[list[str], list[str]]:
    """(inputs, outputs) of the fused decoder: inputs_embeds, attention_mask, past_key_values.{i}.key|value
    -> logits, present.{i}.key|value (per layer, key then value)."""
    past = [f"past_key_values.{i}.{kv}" for i in range(n_layers) for kv in ("key", "value")]
    present = [f"present.{i}.{kv}" for i in range(n_layers) for kv in ("key", "value")]
    return ["inputs_embeds", "attention_mask", *past], ["logits", *present]

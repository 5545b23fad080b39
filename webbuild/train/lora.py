"""Low-rank adapters (LoRA) on the text decoder's projections, saved as a PEFT-style folder.

Each adapted projection computes `W x + scale * B (A x)` with A [r, in], B [out, r] and
scale = lora_alpha / r. B starts at zero, so a fresh adapter changes nothing; the base stays frozen.

The folder holds `adapter_model.safetensors`, whose tensor names say the layer and the projection
(`base_model.model.model.language_model.layers.3.mlp.up_proj.lora_A.weight`, as PEFT names them), and
`adapter_config.json` with `r`, `lora_alpha` and `target_modules`: what model.yaml `adapters:` takes
(webbuild.adapters checks it against the base).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from webbuild.adapters import CONFIG, TARGET_MODULES, WEIGHTS, update_scale

DECODER_PREFIX = "model.language_model.layers."  # the text decoder's layers in the checkpoint's names
PEFT_PREFIX = "base_model.model."  # PEFT's wrapper adds this to every module name


class LoraLinear(nn.Module):
    """A frozen nn.Linear plus its trainable low-rank update."""

    def __init__(self, base: nn.Linear, r: int, alpha: float):
        super().__init__()
        self.base, self.r, self.alpha = base, r, alpha
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))  # PEFT's default
        nn.init.zeros_(self.lora_B.weight)
        self.to(device=base.weight.device, dtype=base.weight.dtype)

    @property
    def scale(self) -> float:
        return self.alpha / self.r

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_B(self.lora_A(x)) * self.scale


def target_names(model: nn.Module, targets: tuple[str, ...] = TARGET_MODULES) -> list[str]:
    """Names of the decoder's nn.Linear projections an adapter adapts."""
    return [name for name, mod in model.named_modules()
            if name.startswith(DECODER_PREFIX) and name.rsplit(".", 1)[-1] in targets and isinstance(mod, nn.Linear)]


def attach(model: nn.Module, r: int, alpha: float, targets: tuple[str, ...] = TARGET_MODULES) -> list[str]:
    """Freeze `model` and put a fresh LoraLinear in place of each target projection; their names."""
    model.requires_grad_(False)
    names = target_names(model, targets)
    for name in names:
        parent, leaf = name.rsplit(".", 1)
        owner = model.get_submodule(parent)
        setattr(owner, leaf, LoraLinear(getattr(owner, leaf), r, alpha))
    return names


def adapted(model: nn.Module) -> dict[str, LoraLinear]:
    return {name: mod for name, mod in model.named_modules() if isinstance(mod, LoraLinear)}


def adapter_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's weights under PEFT's names."""
    out = {}
    for name, mod in adapted(model).items():
        out[f"{PEFT_PREFIX}{name}.lora_A.weight"] = mod.lora_A.weight.detach()
        out[f"{PEFT_PREFIX}{name}.lora_B.weight"] = mod.lora_B.weight.detach()
    return out


def save_adapter(model: nn.Module, folder: Path, dtype: torch.dtype = torch.float16, **metadata) -> Path:
    """Write the folder; `dtype` is the stored precision (fp16 halves the files; the build quantizes
    further). `metadata` (strings) goes into the safetensors header."""
    mods = list(adapted(model).values())
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.to(dtype).contiguous() for k, v in adapter_tensors(model).items()}
    save_file(tensors, str(folder / WEIGHTS), metadata={"format": "pt", **metadata})
    leaves = sorted({name.rsplit(".", 1)[-1] for name in adapted(model)}, key=TARGET_MODULES.index)
    config = {"peft_type": "LORA", "r": mods[0].r, "lora_alpha": mods[0].alpha, "target_modules": leaves,
              "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "use_rslora": False}
    (folder / CONFIG).write_text(json.dumps(config, indent=1) + "\n")
    return folder


def load_adapter(model: nn.Module, folder: Path, scale: float = 1.0) -> list[str]:
    """Attach the folder's adapter to `model`, its update times `scale` (model.yaml's adapter scale);
    the names of the adapted projections."""
    config = json.loads((folder / CONFIG).read_text())
    # LoraLinear scales by alpha / r: an alpha giving PEFT's factor (update_scale: use_rslora too); a string
    # target_modules is PEFT's regular expression, which the build checks against the seven projections
    targets = config["target_modules"]
    targets = TARGET_MODULES if isinstance(targets, str) else tuple(targets)
    names = attach(model, config["r"], update_scale(config) * config["r"] * scale, targets)
    tensors = load_file(str(folder / WEIGHTS))
    for name, mod in adapted(model).items():
        for part in ("lora_A", "lora_B"):
            getattr(mod, part).weight.data.copy_(tensors.pop(f"{PEFT_PREFIX}{name}.{part}.weight"))
    if tensors:
        raise ValueError(f"{folder / WEIGHTS}: tensors for no projection of the model: {sorted(tensors)[:3]}")
    return names

"""A random rank-32 LoRA adapter for any zoo export, to measure what an adapter costs where no trained one
exists (the 0.6b and 1.7b benchmarks): the shapes come from the export's config.json, the values are
drawn as PEFT would after some training (A as PEFT initialises it, B small instead of zero, so the
adapter changes the logits without drowning the base).

    python -m webbuild.zoo.random_adapter EXPORT_DIR OUT_DIR [--seed 0]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from webbuild.adapters import CONFIG, RANK, TARGET_MODULES, WEIGHTS, expected_tensors

B_STD = 0.002  # B's spread: a change of the logits a few percent of their own


def random_adapter(export_dir: Path, out_dir: Path, seed: int = 0) -> Path:
    """Write a PEFT-style folder that model.yaml `adapters:` takes for the export in `export_dir`."""
    from safetensors.numpy import save_file

    base = json.loads((export_dir / "config.json").read_text())
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, (rows, cols) in expected_tensors(base).items():
        if ".lora_A." in name:  # PEFT's kaiming-uniform bound for a [rank, in] weight
            bound = 1 / np.sqrt(cols)
            tensors[name] = rng.uniform(-bound, bound, (rows, cols)).astype(np.float16)
        else:
            tensors[name] = rng.normal(0, B_STD, (rows, cols)).astype(np.float16)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / WEIGHTS), metadata={"format": "pt"})
    config = {"peft_type": "LORA", "r": RANK, "lora_alpha": float(RANK), "target_modules": list(TARGET_MODULES),
              "lora_dropout": 0.0, "bias": "none"}
    (out_dir / CONFIG).write_text(json.dumps(config, indent=1) + "\n")
    return out_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export_dir", type=Path)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(random_adapter(args.export_dir, args.out_dir, args.seed))


if __name__ == "__main__":
    main()

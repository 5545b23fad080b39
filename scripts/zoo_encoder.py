"""Only the encoder of a zoo preset (random weights), as `webbuild zoo` exports it: for measuring the
encoder fusion on the 0.6b/1.7b shapes without the decoders' export (minutes and several GB).
    python scripts/zoo_encoder.py 0.6b /tmp/q06-enc [--exporter dynamo]   -> /tmp/q06-enc/encoder.onnx
"""

import argparse
import logging
from pathlib import Path

from webbuild.zoo.build import random_model
from webbuild.zoo.export import export_encoder, sample_inputs

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("preset")
    p.add_argument("out", type=Path)
    p.add_argument("--exporter", default="torchscript", choices=["torchscript", "dynamo"])
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the export's progress lines
    a.out.mkdir(parents=True, exist_ok=True)
    model, tok = random_model(a.preset)
    model = model.eval().float()
    export_encoder(model, sample_inputs(model, tok), a.out, a.exporter)
    print(f"wrote {a.out / 'encoder.onnx'}")

"""A built site's wasm path against the Python reference on the same graphs, beyond the greedy tokens: the
first sample clip's audio features and prefill logits from scripts/wasm_parity.mjs (onnxruntime-web wasm in
Node, the graphs the wasm plan chose) and from webbuild.reference (onnxruntime CPU), max error relative to
the reference's range, and the top tokens of each.
    PYTHONPATH=. .venv/bin/python scripts/wasm_parity.py DIST
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from webbuild.reference.audio import read_wav
from webbuild.reference.transcribe import load_transcriber

HERE = Path(__file__).resolve().parent


def relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.ptp(want))


if __name__ == "__main__":
    dist = Path(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "wasm.json"
        subprocess.run(["node", str(HERE / "wasm_parity.mjs"), str(dist), str(out)], check=True)
        wasm = json.loads(out.read_text())
    ref = load_transcriber(dist)
    pcm = read_wav(dist / wasm["src"])
    audio = ref.audio_features(pcm)
    logits, _ = ref.decoder.prefill(ref.codec.prompt(audio.shape[1]), audio)
    got_audio, got_logits = np.array(wasm["audio_features"], np.float32), np.array(wasm["logits"], np.float32)
    top = lambda x: np.argsort(-x)[:5].tolist()  # noqa: E731
    print(json.dumps({"clip": wasm["src"], "ep": wasm["ep"], "audio_tokens": int(audio.shape[1]),
                      "audio_features_error": relative(got_audio, audio.ravel()),
                      "logits_error": relative(got_logits, np.asarray(logits, np.float32)),
                      "top5_wasm": top(got_logits), "top5_reference": top(np.asarray(logits))}))

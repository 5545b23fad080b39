"""Reference audio features of a built encoder (pcm input) on onnxruntime CPU, for
scripts/encoder_features.mjs to compare onnxruntime-web against: the example's four sample clips
and the four back to back (11.5 s, two attention windows). Needs only numpy and onnxruntime.
    python scripts/encoder_features.py ENCODER.onnx OUT.json
"""

import json
import sys
import wave
from pathlib import Path

import numpy as np
import onnxruntime as ort

SAMPLES = Path(__file__).resolve().parents[1] / "examples" / "tiny-asr" / "samples"


def pcm(path: Path) -> np.ndarray:
    with wave.open(str(path)) as w:  # the samples are 16 kHz mono int16
        return np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768


if __name__ == "__main__":
    clips = [pcm(p) for p in sorted(SAMPLES.glob("*.wav"))]
    clips.append(np.concatenate(clips))
    sess = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
    out = [{"pcm": c.tolist(), "features": sess.run(None, {"pcm": c[None]})[0].ravel().tolist()} for c in clips]
    Path(sys.argv[2]).write_text(json.dumps(out))
    print(f"{len(out)} clips")

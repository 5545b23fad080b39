#!/usr/bin/env bash
# The encoder's fused ops, and the example's fused int4 encoder as the build ships it (fp32 variant),
# on a real GPU: onnxruntime-web WebGPU on Dawn/Vulkan in Node, against onnxruntime CPU there.
# Here:   scripts/gpu_bench.sh prepare && scripts/gpu_encoder_ops.sh prepare   (.gpu/ .gl/ .gpu-enc/)
# There:  bash scripts/gpu_encoder_ops.sh run   (device `run` tool, carry [".gpu-enc", ".gpu/node.xz",
#         ".gpu/node_modules.tar.xz", ".gl"]; about 57 MiB with the tracked tree)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-encoder-ops-out}

prepare() {
  grep -qx "/.gpu-enc/" .git/info/exclude || echo "/.gpu-enc/" >> .git/info/exclude
  mkdir -p .gpu-enc /tmp/amd64/partial
  local o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  apt-get $o update -q >/dev/null && (cd .gpu-enc && apt-get $o download libvulkan1)
  .venv/bin/python - <<'PY'
import onnx
from pathlib import Path
from webbuild.fusion.fuse_decoder import save
from webbuild.fusion.fuse_encoder import fuse_encoder
from webbuild.pipeline.frontend import add_mel_frontend
from webbuild.quantize.encoder import encoder_variant
from webbuild.quantize.variants import ENCODER_ACCURACY_LEVEL, save_model
out = Path(".gpu-enc")
save(fuse_encoder(Path("examples/tiny-asr/model"))[0], out / "fused", "encoder.onnx")
add_mel_frontend(out / "fused" / "encoder.onnx", out / "fused" / "frontend.onnx")
save_model(encoder_variant(onnx.load(out / "fused" / "frontend.onnx"), "int4", "fp32", ENCODER_ACCURACY_LEVEL), out / "encoder.onnx")
PY
  rm -rf .gpu-enc/fused
}

run() {
  mkdir -p "$OUT" /tmp/bin /tmp/ops
  for f in .gpu-enc/*.deb .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
  export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
  xz -dc .gpu/node.xz > /tmp/bin/node && chmod +x /tmp/bin/node && export PATH=/tmp/bin:$PATH
  tar -xJf .gpu/node_modules.tar.xz
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 scripts/encoder_ops.py /tmp/ops
  for mode in default nosubgroups; do
    node scripts/encoder_ops.mjs /tmp/ops node_modules/onnxruntime-web/dist $mode 2>&1 | tee "$OUT/$mode.txt"
  done
  python3 scripts/encoder_features.py .gpu-enc/encoder.onnx /tmp/features.json
  node scripts/encoder_features.mjs .gpu-enc/encoder.onnx /tmp/features.json node_modules/onnxruntime-web/dist 2>&1 |
    tee "$OUT/features.txt"
}

"${1:-run}"

#!/usr/bin/env bash
# The 0.6b comparison on an NVIDIA GPU machine without network (issue 7): zoo preset generated
# there, built by webbuild (fusion + int4), then webbuild's site and the split export benched by
# the same Node harness on Dawn/Vulkan in one run. Reports land in $OUT (or ./gpu-bench-out).
#
# Here, once:  scripts/gpu_bench.sh prepare      (fills .gpu/ .whl/ .gl/, all in .git/info/exclude)
# There:       bash scripts/gpu_bench.sh run     (device `run` tool, carry [".gpu", ".whl", ".gl"])
#
# Payload check before calling: tracked tree + .gpu + .whl + .gl must stay under the 64 MiB a
# call may carry (du -shc $(git ls-files) .gpu .whl .gl).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-bench-out}

prepare() {
  for d in .gpu .whl .gl; do grep -qx "/$d/" .git/info/exclude || echo "/$d/" >> .git/info/exclude; done
  mkdir -p .gpu .whl .gl
  xz -T0 -c "$(command -v node)" > .gpu/node.xz
  # Only the runtime files: onnxruntime-web's webgpu bundle + asyncify wasm, webgpu's linux dawn.node.
  tar -cJf .gpu/node_modules.tar.xz node_modules/onnxruntime-web/package.json \
    node_modules/onnxruntime-web/dist/ort.webgpu.min.mjs node_modules/onnxruntime-web/dist/ort-wasm-simd-threaded.asyncify.{mjs,wasm} \
    node_modules/webgpu/{package.json,index.js} node_modules/webgpu/dist/linux-x64/dawn.node
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl transformers==5.24.0 pydantic pydantic-core typing-inspection annotated-types
  o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  mkdir -p /tmp/amd64/partial && apt-get $o update -q && (cd .gl && apt-get $o download libvulkan1)
  du -shc $(git ls-files) .gpu .whl .gl | tail -1
}

run() {
  mkdir -p "$OUT"
  for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
  export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
  mkdir -p /tmp/bin && xz -dc .gpu/node.xz > /tmp/bin/node && chmod +x /tmp/bin/node && export PATH=/tmp/bin:$PATH
  tar -xJf .gpu/node_modules.tar.xz
  nproc; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -m pipeline.cli zoo 0.6b -o /tmp/q06
  # One variant (fp16 when the adapter has shader-f16, which the probe picks) keeps the build short.
  printf 'name: q06\nsource: {layout: qwen3-asr-split, dir: /tmp/q06}\nvariants: [fp16, fp32]\nencoder: {precision: fp32}\n' > /tmp/q06.yaml
  python3 -m pipeline.cli /tmp/q06.yaml -o /tmp/dist-q06 2>&1 | tail -20
  python3 -m pipeline.cli bench /tmp/dist-q06 --ep webgpu --json "$OUT/webbuild.json"
  # The split export keeps 3 GB of fp32 decoder weights in one file: onnxruntime-web's wasm32
  # heap may refuse it; the report then says so instead of a number.
  python3 -m pipeline.cli bench /tmp/q06 --ep webgpu --json "$OUT/split.json" || echo "split baseline failed"
}

"${1:-run}"

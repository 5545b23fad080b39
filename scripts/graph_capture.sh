#!/bin/bash
# The graph capture reproduction of docs/graph-capture.md, one command:
#   scripts/graph_capture.sh [CASE...]      (WORK=/tmp/cap by default; ORT=DIR for another onnxruntime-web dist)
# Makes the random tiny zoo model and the onnxruntime-genai builder's graph with enable_webgpu_graph=true
# (once, kept in $WORK), then runs scripts/graph_capture_probe.mjs for each CASE, "EP:CAPTURE[:pin]":
#   device:0  object:1  string:1  (default) ... see the doc for what each shows.
# WebGPU is Dawn in Node; on a machine without a GPU, SwiftShader from Chromium's folder.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-/tmp/cap}
ORT=${ORT:-node_modules/onnxruntime-web/dist}
PY=${PY:-.venv/bin/python}
if [ -z "${VK_ICD_FILENAMES:-}${VK_DRIVER_FILES:-}" ] && [ -f /usr/lib/chromium/vk_swiftshader_icd.json ]; then
  export LD_LIBRARY_PATH=/usr/lib/chromium${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json
fi
mkdir -p "$WORK"
[ -f "$WORK/zoo/embed_tokens.bin" ] || PYTHONPATH=$PWD $PY -m webbuild.cli zoo tiny -o "$WORK/zoo" --hf-dir "$WORK/hf"
[ -f "$WORK/genai/model.onnx" ] || $PY -m onnxruntime_genai.models.builder -i "$WORK/hf" -o "$WORK/genai" -p int4 -e webgpu \
  -c "$WORK/genai-cache" --extra_options exclude_embeds=true use_webgpu_fp32=true enable_webgpu_graph=true 2>&1 | tail -2
cases=("$@"); [ ${#cases[@]} -gt 0 ] || cases=(device:0 object:1 string:1 object:1:pin)
for c in "${cases[@]}"; do
  IFS=: read -r ep capture pin <<< "$c"
  echo "== $c"
  node scripts/graph_capture_probe.mjs "$WORK/genai" "$WORK/zoo/embed_tokens.bin" --ep "$ep" --capture "$capture" \
    --pin "$([ "${pin:-}" = pin ] && echo 1 || echo 0)" --steps "${STEPS:-8}" --ort "$ORT" --json "$WORK/$ep-$capture${pin:+-pin}.json" 2>&1 |
    grep -v 'MODULE_TYPELESS\|Reparsing\|"type": "module"\|trace-warnings\|VerifyEachNode' ||
    echo "(node exited with status $?: a failed case may also crash Dawn at exit)"
done

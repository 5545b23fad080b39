#!/usr/bin/env bash
# The 0.6b speed comparison on an NVIDIA GPU machine without network (issue 7). Three builds of the
# same zoo weights, benched one after another by the same onnxruntime-web on Dawn/Vulkan:
#   baseline  the split export as published: decoder_init + decoder_step, int4 MatMulNBits block 64
#             (webbuild.zoo.published_int4), float embedding table, KV cache on the GPU
#   peer      the onnxruntime-genai builder's graph (-p int4 -e webgpu, exclude_embeds=true so audio
#             can be spliced in; use_webgpu_fp32=true where the adapter lacks shader-f16), at its own
#             default MatMulNBits accuracy level; peer0 the same at accuracy_level=0
#   webbuild  `webbuild model.yaml`: fused, int4, the site's own runtime (WebGPU accuracy level 0, the
#             default); webbuild4 the same with quantize.webgpu_accuracy_level 4
# Reports land in $OUT (or ./gpu-bench-out): one JSON per build plus the log.
#
# Here, once:  scripts/gpu_bench.sh prepare   (fills .gpu/ .whl/ .gl/, all in .git/info/exclude)
# There:       bash scripts/gpu_bench.sh run  (device `run` tool, carry [".gpu", ".whl", ".gl"])
# Every step keeps its result in $WORK and is skipped when that is there: a run cut off by the
# 10-minute limit goes on where it stopped when called again on the same (still warm) machine.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-bench-out}
WORK=${WORK:-/tmp/gpu-bench}
PRESET=${PRESET:-0.6b}
TOKENS=${TOKENS:-128}

prepare() {
  for d in .gpu .whl .gl; do grep -qx "/$d/" .git/info/exclude || echo "/$d/" >> .git/info/exclude; done
  rm -rf .gpu .whl .gl && mkdir -p .gpu .whl .gl
  local tmp; tmp=$(mktemp -d)
  # Node and dawn.node stripped of symbols: the whole call must stay under 64 MiB.
  cp "$(command -v node)" "$tmp/node" && strip "$tmp/node" && xz -9 -T0 -c "$tmp/node" > .gpu/node.xz
  mkdir -p "$tmp/nm" && cp -r --parents node_modules/onnxruntime-web/package.json \
    node_modules/onnxruntime-web/dist/ort.webgpu.min.mjs node_modules/onnxruntime-web/dist/ort-wasm-simd-threaded.asyncify.{mjs,wasm} \
    node_modules/webgpu/{package.json,index.js} node_modules/webgpu/dist/linux-x64/dawn.node "$tmp/nm/"
  strip "$tmp/nm/node_modules/webgpu/dist/linux-x64/dawn.node"
  tar -C "$tmp/nm" -cJf .gpu/node_modules.tar.xz node_modules
  # transformers with only the model families the zoo and the genai builder import (and what those
  # import in turn), plus every configuration, which the auto classes import: ~2 MB, not 13.5.
  local site=.venv/lib/python3*/site-packages
  python3 - "$tmp/tf" $site/transformers <<'EOF'
import re, shutil, sys
from pathlib import Path
dst, src = Path(sys.argv[1]) / "transformers", Path(sys.argv[2])
keep, todo = set(), ["auto", "qwen3_asr", "qwen3", "llama", "gemma3", "lfm2_vl", "mistral3", "qwen2_5_vl",
                     "qwen3_5", "qwen3_5_moe", "qwen3_vl", "qwen2"]
while todo:
    m = todo.pop()
    if m in keep or not (src / "models" / m).is_dir():
        continue
    keep.add(m)
    for f in (src / "models" / m).glob("*.py"):
        todo += re.findall(r"from \.\.(\w+)", f.read_text())
def ignore(d, names):
    p = Path(d)
    drop = {n for n in names if n == "__pycache__"}
    if p.parent == src / "models" and p.name not in keep:
        drop |= {n for n in names if n != "__init__.py" and not n.startswith("configuration_")}
    return drop
shutil.copytree(src, dst, ignore=ignore)
EOF
  tar -C "$tmp/tf" -cJf .gpu/transformers.tar.xz transformers
  # onnxruntime-genai's model builder is plain Python; its native runtime is not needed to build.
  mkdir -p "$tmp/genai/onnxruntime_genai"
  cp -r $site/onnxruntime_genai/models "$tmp/genai/onnxruntime_genai/"
  find "$tmp/genai" -name __pycache__ -prune -exec rm -rf {} +
  echo "__version__ = '$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("onnxruntime-genai"))')'" > "$tmp/genai/onnxruntime_genai/__init__.py"
  tar -C "$tmp/genai" -cJf .gpu/genai.tar.xz onnxruntime_genai
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    "pydantic==$(.venv/bin/python -c 'import pydantic; print(pydantic.VERSION)')" \
    "pydantic-core==$(.venv/bin/python -c 'import pydantic_core; print(pydantic_core.__version__)')" \
    typing-inspection annotated-types "onnx-ir==$(.venv/bin/python -c 'import onnx_ir; print(onnx_ir.__version__)')"
  # the Vulkan loader and the GL dispatch libraries the NVIDIA ICD loads (the GPU image has neither)
  local o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  mkdir -p /tmp/amd64/partial && apt-get $o update -q >/dev/null && (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
  rm -rf "$tmp"
  du -bc $(git ls-files) $(git ls-files --others --exclude-standard) .gpu/* .whl/* .gl/* | tail -1 |
    awk '{printf "payload %.1f MiB of the 64 MiB a call may carry\n", $1 / 1048576}'
}

setup() {
  [ -x /tmp/bin/node ] && return
  for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  tar -C /tmp/site -xJf .gpu/transformers.tar.xz
  tar -C /tmp/site -xJf .gpu/genai.tar.xz
  tar -xJf .gpu/node_modules.tar.xz
  mkdir -p /tmp/bin && xz -dc .gpu/node.xz > /tmp/bin/node.part && chmod +x /tmp/bin/node.part && mv /tmp/bin/node.part /tmp/bin/node
}

# step NAME COMMAND...: runs COMMAND once; its result lives in $WORK/NAME (written to NAME.part first)
step() {
  local name=$1; shift
  [ -e "$WORK/$name" ] && { echo "== $name: done before"; return; }
  echo "== $name"; local t0=$SECONDS
  rm -rf "$WORK/$name.part"
  "$@"
  mv "$WORK/$name.part" "$WORK/$name"
  echo "== $name: $((SECONDS - t0)) s"
}

f16() { node --input-type=module -e "import { installDawn } from './webbuild/tools/bench/dawn.mjs';
  const a = await installDawn().requestAdapter({ powerPreference: 'high-performance' });
  console.log(a.features.has('shader-f16') ? 'yes' : 'no'); process.exit(0);"; }

zoo() { mkdir -p "$WORK/zoo.part" && python3 -m webbuild.cli zoo "$PRESET" -o "$WORK/zoo.part/export" --hf-dir "$WORK/zoo.part/hf"; }
baseline() { python3 -m webbuild.zoo.published_int4 "$WORK/zoo/export" "$WORK/baseline.part"; }
# peer [NAME [EXTRA_OPTION...]]: the genai builder's graph into $WORK/NAME (default peer)
peer() {
  local name=${1:-peer} extra="exclude_embeds=true"; shift $(( $# > 0 ? 1 : 0 ))
  [ "$(f16)" = yes ] || extra+=" use_webgpu_fp32=true"
  python3 -m onnxruntime_genai.models.builder -i "$WORK/zoo/hf" -o "$WORK/$name.part" -p int4 -e webgpu \
    -c "$WORK/genai-cache" --extra_options $extra "$@" 2>&1 | grep -v "^Saving\|it/s" | tail -5
}
peer0() { peer peer0 accuracy_level=0; }
# the genai graph made for graph capture (static KV, mask math on the GPU): docs/graph-capture.md
peerg() { peer peerg accuracy_level=0 enable_webgpu_graph=true; }
# CAPTURE=1: scripts/graph_capture_probe.mjs on peerg, plain and captured (+ the pin workaround); the
# per-step counts, times and tokens land in $OUT/capture-CASE.json (logits dropped: too big to carry)
capture() {
  for c in device:0 object:1:pin; do
    IFS=: read -r ep cap pin <<< "$c"
    node scripts/graph_capture_probe.mjs "$WORK/peerg" "$WORK/zoo/export/embed_tokens.bin" --ep "$ep" --capture "$cap" \
      --pin "$([ "${pin:-}" = pin ] && echo 1 || echo 0)" --steps 32 --max 64 --json "$WORK/capture-$c.json" 2>&1 |
      grep -v 'MODULE_TYPELESS\|Reparsing\|"type": "module"\|trace-warnings\|VerifyEachNode' | tail -8
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d.pop('logits'); json.dump(d, open(sys.argv[2], 'w'))" \
      "$WORK/capture-$c.json" "$OUT/capture-${c//:/-}.json"
  done
  python3 -c "import json,sys; a,b=(json.load(open(f))['logits'] for f in sys.argv[1:]); \
print('captured logits vs plain: max abs diff', max(abs(x-y) for s,t in zip(a,b) for x,y in zip(s,t)))" \
    "$WORK/capture-device:0.json" "$WORK/capture-object:1:pin.json"
}
# webbuild [NAME [YAML LINE]]: `webbuild model.yaml` into $WORK/NAME (default webbuild)
webbuild() {
  local name=${1:-webbuild} variant=fp32; [ "$(f16)" = yes ] && variant=fp16
  printf 'name: %s\nsource: {layout: qwen3-asr-split, dir: %s}\nvariants: [%s]\n%s\n' "$PRESET" "$WORK/zoo/export" \
    "$variant" "${2:-}" > "$WORK/$name.yaml"
  python3 -m webbuild.cli "$WORK/$name.yaml" -o "$WORK/$name.part" 2>&1 | tail -15
}
webbuild4() { webbuild webbuild4 "quantize: {webgpu_accuracy_level: 4}"; }
# lora: the webbuild build plus a random rank-32 adapter `rand` (webbuild.zoo.random_adapter), for the
# cost of an adapter off (bench lora) and on (bench lora on, the bench's --adapter rand)
lora() {
  python3 -m webbuild.zoo.random_adapter "$WORK/zoo/export" "$WORK/adapter-rand" >/dev/null
  webbuild lora "adapters: [{name: rand, path: $WORK/adapter-rand}]"
}
# bench BUILD [TAG KEY=VALUE...]: the build's report as bench-BUILD[-TAG].json, with onnxruntime
# session config entries (the sweep) when given; a TAG starting with "on" benches the lora build with its
# adapter on
bench() {
  local build=$1 tag=${2:+-$2} args=(); shift $(( $# > 1 ? 2 : 1 ))
  for kv in "$@"; do args+=(--session-config "$kv"); done
  [[ $tag == -on* ]] && args+=(--adapter rand)
  python3 -m webbuild.cli bench "$WORK/$build" --ep webgpu --decode-tokens "$TOKENS" "${args[@]}" --json "$WORK/bench-$build$tag.json.part"
}
adapted_ab() {
  node webbuild/tools/bench/adapted_ab.mjs "$WORK/lora" --rounds "$AB_ROUNDS" --decode-tokens "$TOKENS" > "$WORK/adapted-ab.json.part"
}

# With SWEEP=1, WebGPU EP settings tried on the same builds: command buffers flushed every N
# dispatches (onnxruntime's default is 16) and Dawn's validation off. On the H200 none beat the
# defaults (BENCHMARKS.md), so a plain run skips them.
EP=ep.webgpuexecutionprovider
SWEEP_SETTINGS=("d64 $EP.maxNumPendingDispatches=64" "d1024 $EP.maxNumPendingDispatches=1024"
                "d1024-novalidation $EP.maxNumPendingDispatches=1024 $EP.validationMode=disabled")

run() {
  mkdir -p "$OUT" "$WORK"
  setup
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PATH=/tmp/bin:$PATH
  export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; echo "shader-f16: $(f16)"
  # BENCHES: the reports to make, in order (NAME or NAME:ROUND); only the builds they need are made
  local benches=${BENCHES:-webbuild peer baseline webbuild:2 peer:2}
  step zoo zoo
  for b in baseline peer peer0 webbuild webbuild4 lora; do [[ " $benches " == *" $b"[:\ ]* ]] && step "$b" "$b"; done
  [ "${CAPTURE:-0}" = 1 ] && { step peerg peerg; capture; }
  # a second round of the two fast ones shows the run-to-run spread; each report is copied to
  # $OUT as soon as it exists, so a run cut off by the time limit still returns what it measured
  for b in $benches; do
    step "bench-${b/:/-}.json" bench "${b%:*}" "$([[ $b == *:* ]] && echo "${b#*:}")" || echo "$b bench failed"
    cp "$WORK/bench-${b/:/-}.json" "$OUT/" 2>/dev/null || true
  done
  # AB_ROUNDS=N: the lora build's base decode with and without its adapted sessions loaded, in one process
  # (webbuild/tools/bench/adapted_ab.mjs), N rounds ordered ABBA
  if [ "${AB_ROUNDS:-0}" -gt 0 ]; then
    step lora lora
    step adapted-ab.json adapted_ab || echo "adapted-ab failed"
    cp "$WORK/adapted-ab.json" "$OUT/" 2>/dev/null || true
  fi
  if [ "${SWEEP:-0}" = 1 ]; then
    for entry in "${SWEEP_SETTINGS[@]}"; do
      read -r tag kvs <<< "$entry"
      for b in webbuild peer; do step "bench-$b-$tag.json" bench "$b" "$tag" $kvs || echo "$b $tag bench failed"; done
    done
  fi
  du -sb "$WORK"/{baseline,peer,webbuild/model} 2>/dev/null || true
}

"${1:-run}"

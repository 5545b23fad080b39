#!/usr/bin/env bash
# The GPU machine's wrapper and the 0.6b speed bench run on it (scripts/README.md).
#
# What every device script needs to know about the GPU machine is written here once:
#   - A device call sends the tracked tree of the checkout the device tool sends (the main one, also
#     when this runs from a worktree: `root`) plus the ignored folders named in its carry: 64 MiB in
#     all. `payload DIR...` says what a call carrying DIR... weighs against that limit.
#   - The machine has python3 and the NVIDIA driver, nothing else: no network, no Node, no Vulkan
#     loader. `prepare` packs them into .gpu/ .whl/ .gl/ here; `setup` unpacks them there, outside
#     the tree (a carried folder is replaced on every call): the loader debs into /, Node into
#     /tmp/bin, the wheels, a trimmed transformers and the genai builder into /tmp/site,
#     onnxruntime-web + dawn.node into the checkout's node_modules. `env` prints the exports that
#     run Python, Node and Dawn/Vulkan there (for `eval`).
#   - What a call brings back is what it leaves in $OUT: at most 8 files of 16 MiB (64 MiB together,
#     2 folders deep). Each script copies its reports there as soon as they exist, so a call cut off
#     at the 10-minute limit still returns what it measured.
#
# The bench (`run`): three builds of the same zoo weights, benched one after another by the same
# onnxruntime-web on Dawn/Vulkan:
#   baseline  the split export as published: decoder_init + decoder_step, int4 MatMulNBits block 64
#             (webbuild.zoo.published_int4), float embedding table, KV cache on the GPU
#   peer      the onnxruntime-genai builder's graph (-p int4 -e webgpu, exclude_embeds=true so audio
#             can be spliced in; use_webgpu_fp32=true where the adapter lacks shader-f16), at its own
#             default MatMulNBits accuracy level; peer0 the same at accuracy_level=0
#   webbuild  `webbuild model.yaml`: fused, int4, the site's own runtime (WebGPU accuracy level 0, the
#             default); webbuild4 the same with quantize.webgpu_accuracy_level 4
# Every step keeps its result in $WORK and is skipped when that is there: a run cut off by the
# 10-minute limit goes on where it stopped when called again on the same (still warm) machine.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CODE=$(cd "$HERE/.." && pwd)  # the checkout this script belongs to
CARRIED=$PWD                  # there: the sent checkout, where the carried folders are
LIMIT_MIB=64
NV_ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
NV_EGL=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
OUT=${OUT:-$CODE/gpu-bench-out}
WORK=${WORK:-/tmp/gpu-bench}
PRESET=${PRESET:-0.6b}
TOKENS=${TOKENS:-128}

usage() {
  cat <<USAGE
usage: scripts/gpu_bench.sh [COMMAND]   (COMMAND defaults to run)

Here, on this machine:
  prepare          fill .gpu/ .whl/ .gl/ in the sent checkout: Node, onnxruntime-web + dawn.node,
                   a trimmed transformers, the genai builder's Python, wheels, Vulkan/GL loader debs
  payload [DIR...] MiB a device call carrying DIR... sends, against the $LIMIT_MIB MiB limit (exit 1 when over)
  root             print the checkout the device tool sends (where carried folders go)
  ignore DIR...    add DIR... of that checkout to its .git/info/exclude (sent only when carried)
There, after a call carrying [".gpu/node.xz"] that parks it (mkdir -p /tmp/gpucarry && cp -a .gpu/. /tmp/gpucarry/:
the tree and all of .gpu pass the limit), in a call carrying the rest of .gpu with [".whl", ".whlx", ".gl"] that
begins with cp -a .gpu/. /tmp/gpucarry/ && rm -rf .gpu && cp -a /tmp/gpucarry .gpu (docs/gpu-machine.md):
  setup [CODE]     unpack them outside the tree; node_modules into CODE (default: this checkout)
  env [CODE]       print the exports that run Python (PYTHONPATH=/tmp/site:CODE), Node and Vulkan
  run              setup, then zoo $PRESET, the builds BENCHES needs and their benches:
                   \$OUT/bench-BUILD[-ROUND].json (+ adapted-ab.json with AB_ROUNDS)
  -h, --help       this text

Environment: OUT (results, default ./gpu-bench-out), WORK (steps, default /tmp/gpu-bench), PRESET (0.6b),
TOKENS (128 decode tokens), BENCHES (default "webbuild peer baseline webbuild:2 peer:2": NAME or
NAME:ROUND; builds baseline peer peer0 webbuild webbuild4 lora), AB_ROUNDS (N: the lora build's base
decode with and without its adapted sessions, ABBA), SWEEP=1 (WebGPU EP settings on webbuild and peer),
CARRY_ROOT (where prepare puts the carried folders).
USAGE
}

# the checkout the device tool sends: the main one, also when this runs from a worktree
carry_root() {
  [ -n "${CARRY_ROOT:-}" ] && { echo "$CARRY_ROOT"; return; }
  (cd "$CODE" && cd "$(git rev-parse --path-format=absolute --git-common-dir)/.." && pwd)
}

# ignore DIR...: DIR... of the sent checkout are ignored by its git (.git/info/exclude): only a carry sends them
ignore() {
  local root d; root=$(carry_root)
  for d in "$@"; do grep -qx "/$d/" "$root/.git/info/exclude" 2>/dev/null || echo "/$d/" >> "$root/.git/info/exclude"; done
}

# payload DIR...: the tracked and untracked-not-ignored files of the sent checkout plus DIR...
payload() {
  local root; root=$(carry_root)
  (cd "$root" && { du -bc $(git ls-files) $(git ls-files --others --exclude-standard) "$@" 2>/dev/null || true; } | tail -1 |
    awk -v limit="$LIMIT_MIB" -v dirs="$*" '{ mib = $1 / 1048576
      printf "payload %.1f MiB of the %d MiB a call may carry (the tree%s)\n", mib, limit, dirs == "" ? "" : " + " dirs
      exit (mib > limit) }')
}

prepare() {
  local root; root=$(carry_root)
  ignore .gpu .whl .gl .whlx
  cd "$CODE"  # node, node_modules and .venv of this checkout; what a call carries goes into $root
  rm -rf "$root/.gpu" "$root/.whl" "$root/.whlx" "$root/.gl" && mkdir -p "$root/.gpu" "$root/.whl" "$root/.whlx" "$root/.gl"
  local tmp; tmp=$(mktemp -d)
  # Node and dawn.node stripped of symbols: the whole call must stay under $LIMIT_MIB MiB.
  cp "$(command -v node)" "$tmp/node" && strip "$tmp/node" && xz -9 -T0 -c "$tmp/node" > "$root/.gpu/node.xz"
  mkdir -p "$tmp/nm" && cp -r --parents node_modules/onnxruntime-web/package.json \
    node_modules/onnxruntime-web/dist/ort.webgpu.min.mjs node_modules/onnxruntime-web/dist/ort-wasm-simd-threaded.asyncify.{mjs,wasm} \
    node_modules/webgpu/{package.json,index.js} node_modules/webgpu/dist/linux-x64/dawn.node \
    node_modules/@ricky0123/vad-web/package.json node_modules/@ricky0123/vad-web/dist/silero_vad_v5.onnx "$tmp/nm/"
  strip "$tmp/nm/node_modules/webgpu/dist/linux-x64/dawn.node"
  tar -C "$tmp/nm" -cJf "$root/.gpu/node_modules.tar.xz" node_modules
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
  tar -C "$tmp/tf" -cJf "$root/.gpu/transformers.tar.xz" transformers
  # onnxruntime-genai's model builder is plain Python; its native runtime is not needed to build.
  mkdir -p "$tmp/genai/onnxruntime_genai"
  cp -r $site/onnxruntime_genai/models "$tmp/genai/onnxruntime_genai/"
  find "$tmp/genai" -name __pycache__ -prune -exec rm -rf {} +
  echo "__version__ = '$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("onnxruntime-genai"))')'" > "$tmp/genai/onnxruntime_genai/__init__.py"
  tar -C "$tmp/genai" -cJf "$root/.gpu/genai.tar.xz" onnxruntime_genai
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$root/.whl" \
    "pydantic==$(.venv/bin/python -c 'import pydantic; print(pydantic.VERSION)')" \
    "pydantic-core==$(.venv/bin/python -c 'import pydantic_core; print(pydantic_core.__version__)')" \
    typing-inspection annotated-types "onnx-ir==$(.venv/bin/python -c 'import onnx_ir; print(onnx_ir.__version__)')"
  # huggingface-hub at this venv's version and what it imports that the GPU image lacks (transformers refuses the
  # image's older hub), and `kernels` (the genai builder's from_pretrained stopped in set_use_kernels without it):
  # .whlx, carried apart from .whl, since Chromium's first call has no room for it
  # (chrome_gpu_bench.sh carries it in its second call, and its build waits for it)
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$root/.whlx" \
    $(for p in huggingface-hub httpx2 httpcore2 truststore anyio kernels tomlkit; do
        .venv/bin/python -c "import importlib.metadata as m, sys; print(f'{sys.argv[1]}=={m.version(sys.argv[1])}')" $p 2>/dev/null
      done)
  # the Vulkan loader and the GL dispatch libraries the NVIDIA ICD loads (the GPU image has neither)
  local o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  mkdir -p /tmp/amd64/partial && apt-get $o update -q >/dev/null && (cd "$root/.gl" && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
  rm -rf "$tmp"
  # what the two calls that bring .gpu carry (see usage): each must fit
  payload .gpu/node.xz
  payload .gpu/genai.tar.xz .gpu/node_modules.tar.xz .gpu/transformers.tar.xz .whl .whlx .gl
}

# install_extra_wheels DIR: .whlx's wheels into /tmp/site, where a call carried them
install_extra_wheels() {
  compgen -G "$1/*.whl" >/dev/null || return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$1"/*.whl
}

# setup [CODE]: what prepare packed, unpacked outside the carried folders; node last, as the sign
# that the rest is there (a later call on the warm machine skips it)
setup() {
  local code=${1:-$CODE}
  if [ ! -x /tmp/bin/node ]; then
    for f in "$CARRIED"/.gl/*.deb; do dpkg -x "$f" /; done; ldconfig
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$CARRIED"/.whl/*.whl
    install_extra_wheels "$CARRIED/.whlx"
    tar -C /tmp/site -xJf "$CARRIED/.gpu/transformers.tar.xz"
    tar -C /tmp/site -xJf "$CARRIED/.gpu/genai.tar.xz"
    mkdir -p /tmp/bin && xz -dc "$CARRIED/.gpu/node.xz" > /tmp/bin/node.part && chmod +x /tmp/bin/node.part
    mv /tmp/bin/node.part /tmp/bin/node
  fi
  [ -d "$code/node_modules/onnxruntime-web" ] && [ -d "$code/node_modules/@ricky0123/vad-web" ] \
    || tar -C "$code" -xJf "$CARRIED/.gpu/node_modules.tar.xz"
  (cd "$code" && python3 webbuild/site/ort_files.py)  # the package's copy a build ships (webbuild/site/onnxruntime-web/)
}

# env [CODE]: the exports for `eval "$(scripts/gpu_bench.sh env CODE)"`
device_env() {
  local code=${1:-$CODE}
  cat <<ENV
export PYTHONPATH=/tmp/site:$code PYTHONUNBUFFERED=1 PATH=/tmp/bin:\$PATH
export VK_DRIVER_FILES=\${VK_DRIVER_FILES:-$NV_ICD} VK_ICD_FILENAMES=\${VK_ICD_FILENAMES:-$NV_ICD}
export __EGL_VENDOR_LIBRARY_FILENAMES=\${__EGL_VENDOR_LIBRARY_FILENAMES:-$NV_EGL}
ENV
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
  eval "$(device_env)"
  cd "$CODE"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; echo "shader-f16: $(f16)"
  # BENCHES: the reports to make, in order (NAME or NAME:ROUND); only the builds they need are made
  local benches=${BENCHES:-webbuild peer baseline webbuild:2 peer:2}
  step zoo zoo
  for b in baseline peer peer0 webbuild webbuild4 lora; do [[ " $benches " == *" $b"[:\ ]* ]] && step "$b" "$b"; done
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

case ${1:-run} in
  -h|--help|help) usage ;;
  prepare|payload|ignore|setup|run) "$@" ;;
  install-extra-wheels) install_extra_wheels "${2:-$CARRIED/.whlx}" ;;
  root) carry_root ;;
  env) shift; device_env "$@" ;;
  *) usage >&2; exit 2 ;;
esac

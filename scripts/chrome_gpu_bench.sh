#!/usr/bin/env bash
# Issue 15 parts 2 and 3 on the H200: `webbuild verify`, `webbuild bench --runtime browser` and the
# Chromium / Node + Dawn / genai-peer rounds (scripts/chrome_gpu_bench.py) on the 0.6b build, in the
# Chromium of scripts/chrome_gpu.sh with WebGPU on the NVIDIA adapter. docs/chrome-gpu-bench.md has the
# results and the exact sequence of device calls.
#
# Here, once:   scripts/gpu_bench.sh prepare         (.gpu .whl .gl: Node, ORT + dawn.node, transformers, genai builder)
#               scripts/chrome_gpu.sh prepare        (or an existing $STAGE with the browser in 4 xz parts)
#               scripts/chrome_gpu_bench.sh prepare  (.wb2: this branch's HEAD; .wb2pw: Playwright for Python,
#                                                     greenlet, a font)
#               STAGE=... scripts/chrome_gpu_bench.sh parts   (.cp0-.cp2: browser parts 0-2; .chrome: part 3)
# There, device calls back to back while the machine is warm (all folders are ignored ones of the main
# checkout, which is what the device tool sends):
#   1. carry .gpu .whl .gl .wb2:  bash .wb2/scripts/chrome_gpu_bench.sh gen
#        setup, then zoo 0.6b + webbuild build + genai peer in a process of its own (~3 min there)
#   2. carry .cp0 .wb2pw:  mkdir -p /tmp/chrome-parts && mv .cp0/* /tmp/chrome-parts/ && bash /tmp/wb2/scripts/chrome_gpu_bench.sh pw
#   3. carry .cp1:         mv .cp1/* /tmp/chrome-parts/          4. the same with .cp2
#   5. carry .chrome:      bash .chrome/chrome_gpu.sh setup && bash /tmp/wb2/scripts/chrome_gpu_bench.sh run
#        waits for the builds, then verify, bench --runtime browser, the rounds (STEPS, ROUNDS, ROWS)
# Every step keeps its result in $WORK and is skipped when that is there, so a `run` cut off by the
# 10-minute limit goes on where it stopped when called again on the same warm machine.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$PWD/chrome-gpu-bench-out}
WORK=${WORK:-/tmp/cgb}
WB=/tmp/wb2  # the code snapshot there
PRESET=${PRESET:-0.6b}
ROUNDS=${ROUNDS:-3}
NV_ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
NV_EGL=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
# docs/chrome-gpu.md: WebGPU on the NVIDIA Vulkan driver in headless Chromium (config vk_angle);
# Playwright adds --headless and --no-sandbox, webbuild --enable-unsafe-webgpu
GPU_FLAGS="--enable-gpu --ignore-gpu-blocklist --use-angle=vulkan --enable-features=Vulkan --use-vulkan=native --disable-vulkan-surface"

carry_root() { (cd "$HERE/.." && cd "$(git rev-parse --path-format=absolute --git-common-dir)/.." && pwd); }

prepare() {
  local root src; root=$(carry_root); src=$(cd "$HERE/.." && pwd)
  for d in .wb2 .wb2pw; do grep -qx "/$d/" "$root/.git/info/exclude" || echo "/$d/" >> "$root/.git/info/exclude"; done
  rm -rf "$root/.wb2" "$root/.wb2pw" && mkdir -p "$root/.wb2" "$root/.wb2pw"
  # committed code only: what runs there is a commit of this branch
  git -C "$src" archive HEAD webbuild scripts pyproject.toml package.json | tar -x -C "$root/.wb2"
  # Playwright for Python without its bundled Node (the Node of .gpu runs its driver:
  # PLAYWRIGHT_NODEJS_PATH), and greenlet, its one dependency, for Python 3.12
  local site tmp; site=$(ls -d "$root"/.venv/lib/python3*/site-packages | head -1); tmp=$(mktemp -d)
  cp -a "$site/playwright" "$tmp/" && rm -rf "$tmp/playwright/driver/node" "$tmp/playwright/driver/package/types"
  find "$tmp/playwright" -name __pycache__ -prune -exec rm -rf {} +
  tar -C "$tmp" -cf - playwright | xz -6 -T2 > "$root/.wb2pw/playwright.tar.xz"
  "$root/.venv/bin/python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 -d "$root/.wb2pw" \
    "greenlet==$("$root/.venv/bin/python" -c 'import greenlet; print(greenlet.__version__)')"
  # a font: Playwright's navigation aborted the browser process (SIGABRT after "Could not find any
  # font" and TextRunHarfBuzz errors) on the GPU machine, which has none
  cp /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf "$root/.wb2pw/"
  printf '<?xml version="1.0"?>\n<fontconfig><dir>/tmp/fonts</dir><cachedir>/tmp/fonts/cache</cachedir></fontconfig>\n' > "$root/.wb2pw/fonts.conf"
  rm -rf "$tmp"; du -sh "$root/.wb2" "$root/.wb2pw"
}

# browser parts 0-2 hard-linked into .cp0-.cp2 (one a call), part 3 with chrome_gpu.sh's files in .chrome
parts() {
  local root; root=$(carry_root); STAGE=${STAGE:-$root/.chrome-stage}
  for i in 0 1 2; do
    grep -qx "/.cp$i/" "$root/.git/info/exclude" || echo "/.cp$i/" >> "$root/.git/info/exclude"
    rm -rf "$root/.cp$i" && mkdir "$root/.cp$i" && ln "$STAGE/chrome.tar.xz.$i" "$root/.cp$i/"
  done
  STAGE=$STAGE bash "$HERE/chrome_gpu.sh" load 3
}

# ---- there ----

# Node, onnxruntime-web + dawn.node, the loader debs and the Python wheels of gpu_bench.sh, unpacked
# outside the tree (a carried folder is replaced on every call)
setup() {
  mkdir -p $WB && cp -a "$HERE/../." $WB/  # the code; node_modules stays
  [ -x /tmp/bin/node ] && [ -d $WB/node_modules ] && return
  for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  tar -C /tmp/site -xJf .gpu/transformers.tar.xz
  tar -C /tmp/site -xJf .gpu/genai.tar.xz
  tar -C $WB -xJf .gpu/node_modules.tar.xz
  mkdir -p /tmp/bin && xz -dc .gpu/node.xz > /tmp/bin/node.part && chmod +x /tmp/bin/node.part && mv /tmp/bin/node.part /tmp/bin/node
}

env_there() {
  cd $WB  # `python3 -m` puts the working folder first: the snapshot, not the sent checkout
  export PYTHONPATH=/tmp/site:$WB PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1 PATH=/tmp/bin:$PATH
  export FONTCONFIG_FILE=/tmp/fonts/fonts.conf
  export VK_DRIVER_FILES=${VK_DRIVER_FILES:-$NV_ICD} VK_ICD_FILENAMES=${VK_ICD_FILENAMES:-$NV_ICD}
  export __EGL_VENDOR_LIBRARY_FILENAMES=${__EGL_VENDOR_LIBRARY_FILENAMES:-$NV_EGL}
}

# step NAME COMMAND...: runs COMMAND once; its result lives in $WORK/NAME (written to NAME.part first)
step() {
  local name=$1; shift
  [ -e "$WORK/$name" ] && { echo "== $name: done before"; return; }
  echo "== $name $(date +%T)"; local t0=$SECONDS
  rm -rf "$WORK/$name.part"
  "$@"
  mv "$WORK/$name.part" "$WORK/$name"
  echo "== $name: $((SECONDS - t0)) s"
}

zoo() { mkdir -p "$WORK/zoo.part" && python3 -m webbuild.cli zoo "$PRESET" -o "$WORK/zoo.part/export" --hf-dir "$WORK/zoo.part/hf"; }
# fp32: the adapter has no shader-f16 there. Two of the example's clips as samples: the random weights
# say 200 reserved tokens for 3 words (WER ~67), so the bound is open and what verify checks is the
# Python reference.
webbuild() {
  cat > "$WORK/model.yaml" <<EOF
name: qwen3-asr-$PRESET-zoo
source: {layout: qwen3-asr-split, dir: $WORK/zoo/export}
variants: [fp32]
site:
  samples:
    - {audio: $WORK/samples/sample-1.wav, text: $(cat "$WORK"/samples/sample-1.txt)}
    - {audio: $WORK/samples/sample-2.wav, text: $(cat "$WORK"/samples/sample-2.txt)}
verify: {max_wer: 1000}
EOF
  python3 -m webbuild.cli "$WORK/model.yaml" -o "$WORK/webbuild.part" 2>&1 | tail -15
}
# the peer at its better MatMulNBits accuracy level on the H200 (0: BENCHMARKS.md, issue 14's rounds)
peer() {
  python3 -m onnxruntime_genai.models.builder -i "$WORK/zoo/hf" -o "$WORK/peer.part" -p int4 -e webgpu \
    -c "$WORK/genai-cache" --extra_options exclude_embeds=true use_webgpu_fp32=true \
    accuracy_level=${PEER_ACCURACY_LEVEL:-0} 2>&1 | grep -v "^Saving\|it/s" | tail -5
}

# call 1: setup, then the model and the two builds in a process of its own (it outlives the call)
gen() {
  setup
  mkdir -p "$WORK/samples" && cp examples/tiny-asr/samples/sample-[12].{wav,txt} "$WORK/samples/"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
  WORK=$WORK setsid nohup bash -c "bash $WB/scripts/chrome_gpu_bench.sh _gen || echo 'gen failed'" > "$WORK/gen.log" 2>&1 < /dev/null &
  sleep 2; cat "$WORK/gen.log"
}
_gen() {
  env_there
  step zoo zoo
  step webbuild webbuild
  step peer peer
  du -sb "$WORK"/{webbuild/model,peer} || true
  echo "gen done"
}

# call 2: Playwright for Python (+ greenlet) into /tmp/site
pw() {
  local from=${1:-.wb2pw}
  [ -d /tmp/site/playwright ] || tar -C /tmp/site -xJf "$from/playwright.tar.xz"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$from"/greenlet-*.whl
  mkdir -p /tmp/fonts && cp "$from"/DejaVuSans.ttf "$from"/fonts.conf /tmp/fonts/
  tail -3 "$WORK/gen.log"
}

# the browser as Playwright starts it: Chromium's own libraries for it alone
browser_wrapper() {
  cat > /tmp/chrome/chromium-gpu <<'EOF'
#!/bin/sh
export LD_LIBRARY_PATH=/tmp/chrome/lib
exec /tmp/chrome/chromium "$@"
EOF
  chmod +x /tmp/chrome/chromium-gpu
}

verify() {
  local rc=0
  python3 -m webbuild.cli verify "$WORK/webbuild" --json "$WORK/verify.json.part" || rc=$?
  echo "verify exit code $rc"
}
bench_browser() {
  python3 -m webbuild.cli bench "$WORK/webbuild" --runtime browser --ep webgpu --json "$WORK/bench-browser.json.part"
}
rounds() {
  python3 $WB/scripts/chrome_gpu_bench.py --dist "$WORK/webbuild" --peer "$WORK/peer" --rounds "$ROUNDS" \
    --rows "${ROWS:-chromium-webbuild,chromium-peer,node-webbuild}" ${TIMING:+--timing} --out "$WORK/rounds.json.part"
}

# last call: wait for the builds, then verify, bench --runtime browser, the rounds
run() {
  mkdir -p "$OUT" "$WORK"
  env_there
  browser_wrapper
  # TIMING=1: GPU kernel times per token after the rounds; the developer features unquantize timestamps
  export WEBBUILD_BROWSER=/tmp/chrome/chromium-gpu WEBBUILD_BROWSER_ARGS=${WEBBUILD_BROWSER_ARGS:-$GPU_FLAGS${TIMING:+ --enable-webgpu-developer-features}}
  export PLAYWRIGHT_NODEJS_PATH=/tmp/bin/node
  local t0=$SECONDS
  until grep -q "gen done" "$WORK/gen.log" 2>/dev/null; do
    grep -q "gen failed" "$WORK/gen.log" 2>/dev/null && { tail -5 "$WORK/gen.log"; exit 3; }
    (( SECONDS - t0 > ${GEN_WAIT_S:-420} )) && { tail -5 "$WORK/gen.log"; echo "builds not done"; exit 3; }
    sleep 5
  done
  grep "^== " "$WORK/gen.log"
  # what a step has written so far comes back even when the call is cut off at its time limit
  (while sleep 5; do cp "$WORK"/*.json.part "$OUT"/ 2>/dev/null; done) & local copier=$!
  for s in ${STEPS:-verify bench_browser rounds}; do
    local name=${s//_/-}.json; [ "$s" = verify ] && name=verify.json
    step "$name" "$s" || echo "$s failed"
    cp "$WORK/$name" "$OUT/" 2>/dev/null || cp "$WORK/$name.part" "$OUT/$name.partial" 2>/dev/null || true
  done
  kill $copier 2>/dev/null; rm -f "$OUT"/*.json.part
  cp "$WORK/gen.log" "$OUT/" 2>/dev/null || true
}

"${1:-run}" "${@:2}"

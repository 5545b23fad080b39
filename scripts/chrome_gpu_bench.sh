#!/usr/bin/env bash
# `webbuild verify`, `webbuild bench --runtime browser` and the Chromium / Node + Dawn / genai-peer
# rounds (`webbuild bench --rounds`: webbuild/tools/bench/rounds.py) on the 0.6b build, on the GPU machine, in Debian's Chromium with
# WebGPU on the NVIDIA adapter (docs/gpu-machine.md: the flags and environment that put it there, and the
# sequence of device calls; the results are in BENCHMARKS.md); scripts/gpu_bench.sh
# holds what is common to the GPU machine (payload limit, .gpu/.whl/.gl, unpacking, environment).
#
# The browser travels xz-compressed in parts over consecutive calls while the machine is warm (a
# call carries at most 64 MiB with the tracked tree), each part parked in /tmp/chrome-parts there,
# since a carried folder replaces its copy on every call.
# Every step keeps its result in $WORK and is skipped when that is there, so a `run` cut off by the
# 10-minute limit goes on where it stopped when called again on the same warm machine.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
WRAPPER=$HERE/gpu_bench.sh
OUT=${OUT:-$PWD/chrome-gpu-bench-out}
WORK=${WORK:-/tmp/cgb}
WB=/tmp/wb2  # the code snapshot there
PRESET=${PRESET:-0.6b}
ROUNDS=${ROUNDS:-3}
PARTS=4  # 117 MB of xz: four parts of 29 MB, each beside the tracked tree
# docs/gpu-machine.md: WebGPU on the NVIDIA Vulkan driver in headless Chromium (config vk_angle);
# Playwright adds --headless and --no-sandbox, webbuild --enable-unsafe-webgpu
GPU_FLAGS="--enable-gpu --ignore-gpu-blocklist --use-angle=vulkan --enable-features=Vulkan --use-vulkan=native --disable-vulkan-surface"

usage() {
  cat <<'USAGE'
usage: scripts/chrome_gpu_bench.sh [COMMAND]   (COMMAND defaults to run)

Here, once (folders go into the checkout the device tool sends, ignored by git):
  scripts/gpu_bench.sh prepare          .gpu .whl .gl: Node, onnxruntime-web + dawn.node, wheels, loader debs
  prepare                               .wb2: this branch's HEAD; .wb2pw: Playwright for Python, greenlet, a font
  browser                               $STAGE (default .chrome-stage): this machine's Chromium and the
                                        libraries it links, in 4 xz parts + parts.sha256
  parts                                 .cp0 .. .cp3: one part each, for one call each
  ortalt                                ORT_VERSION=X.Y.Z: that onnxruntime-web's shipped files in .ortalt (carry it
                                        in a stash call) for the ort_build and ort_ab steps
There, device calls back to back while the machine is warm:
  0. carry .gpu/node.xz:        mkdir -p /tmp/gpucarry && cp -a .gpu/. /tmp/gpucarry/   (all of .gpu passes the limit)
  1. carry the rest of .gpu, .whl .gl .wb2 .whlx:
       cp -a .gpu/. /tmp/gpucarry/ && rm -rf .gpu && cp -a /tmp/gpucarry .gpu && bash .wb2/scripts/chrome_gpu_bench.sh gen
       setup, then zoo 0.6b + webbuild build + genai peer in a process of its own (~3-4 min)
  2. carry .cp0 .wb2pw:         bash /tmp/wb2/scripts/chrome_gpu_bench.sh pw
  3. carry .cp1:                bash /tmp/wb2/scripts/chrome_gpu_bench.sh stash      4. the same with .cp2
  5. carry .cp3:                bash /tmp/wb2/scripts/chrome_gpu_bench.sh run
       unpacks the browser, waits for the builds, then the STEPS; $OUT gets verify.json,
       bench-browser.json, rounds.json (a step cut off: NAME.json.partial) and gen.log

Environment: OUT, WORK (/tmp/cgb), PRESET (0.6b; 1.7b; example: the embedded example, no zoo or peer), WB_TREE (1: prepare sends the working tree, not HEAD), STAGE, STEPS ("verify bench_browser rounds"; also first_use:
a fresh page per first-clip length, first-use-N.json, and the same build with BASE_REF's page runtime,
first-use-base-N.json; first_use_query: those pages alternated with the same ones given FIRST_USE_QUERY (e.g.
runs=whole), first-use-query-N.json; live: `webbuild verify --live only`, live.json; lora_browser: adapter on and off alternated, lora-on-N.json
and lora-off-N.json, on a LORA=1 build; lora_rounds: on and off alternated on one page, with TIMING=1 their GPU kernel
times, lora-rounds.json), FIRST_USE (1,2.5,5,8,15,30), FIRST_USE_ROUNDS (2), BASE_REF (main, at prepare),
LORA=1 (gen builds with a random rank-32 adapter `rand`: give it its own WORK), STEP_TRACE=N (rounds: N captured
steps timed one by one, webbuild bench --step-trace), base_build (BASE_REF's code, carried as .wbbase from
`basecode` in a stash call, builds the same model.yaml), wasm_threads (WASM_THREADS 1,2,4,8,16; then WASM_AB_THREADS
against base_build's site, WASM_ROUNDS; WASM_MAX_NEW caps each clip's decode, for the 1.7b),
ort_build then ort_ab (.ortalt's onnxruntime-web against the pinned one, ROUNDS alternated benches of each build),
gqa_build then gqa_ab (the step form's attention as onnxruntime's GroupQueryAttention, fusion.step_attention: gqa,
against the default written out, likewise; GQA=1: gen builds it too),
ROUNDS (3), ROWS (chromium-webbuild,chromium-peer,node-webbuild[,node-peer]), PEER=0 (gen skips the genai peer), TIMING=1 (GPU kernel
times after the rounds), PEER_ACCURACY_LEVEL (0), GEN_WAIT_S (420), WEBBUILD_BROWSER_ARGS.
USAGE
}

# ---- here ----

# .wb2: the committed code; .wb2pw: Playwright for Python and what it needs there
prepare() {
  local root src; root=$(bash "$WRAPPER" root); src=$(cd "$HERE/.." && pwd)
  bash "$WRAPPER" ignore .wb2 .wb2pw
  rm -rf "$root/.wb2" "$root/.wb2pw" && mkdir -p "$root/.wb2" "$root/.wb2pw"
  # committed code (what runs there is a commit of this branch), or with WB_TREE=1 the working tree as it is
  # (tracked and untracked files git does not ignore): a measurement of work before its commit
  if [ "${WB_TREE:-0}" = 1 ]; then
    (cd "$src" && git ls-files -co --exclude-standard -- webbuild scripts pyproject.toml package.json | tar -cf - -T -) \
      | tar -x -C "$root/.wb2"
  else
    git -C "$src" archive HEAD webbuild scripts pyproject.toml package.json | tar -x -C "$root/.wb2"
  fi
  # the page runtime of BASE_REF (default main) too: first_use runs the same build with it, for a before/after
  mkdir -p "$root/.wb2/base" && git -C "$src" archive "${BASE_REF:-main}" webbuild/template | tar -x -C "$root/.wb2/base"
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
  bash "$WRAPPER" payload .gpu/genai.tar.xz .gpu/node_modules.tar.xz .gpu/transformers.tar.xz .whl .gl .wb2 .whlx
}

# this machine's Chromium without the validation layer, the mock ICD and all locales but en-US, with
# every shared library it links except glibc's and the compiler runtime (newer there), plus the NSS
# modules NSS opens at run time: 324 MB, 117 MB of xz, in $PARTS parts
browser() {
  local root src=/usr/lib/chromium; root=$(bash "$WRAPPER" root)
  STAGE=${STAGE:-$root/.chrome-stage}
  bash "$WRAPPER" ignore .chrome-stage
  rm -rf "$STAGE" && mkdir -p "$STAGE/root/chrome/lib" "$STAGE/root/chrome/locales"
  (cd $src && cp -a chromium chrome_crashpad_handler icudtl.dat resources.pak chrome_100_percent.pak \
     snapshot_blob.bin v8_context_snapshot.bin libvk_swiftshader.so vk_swiftshader_icd.json libvulkan.so.1 \
     libEGL.so libGLESv2.so "$STAGE/root/chrome/" && cp locales/en-US.pak "$STAGE/root/chrome/locales/")
  ldd $src/chromium | awk '$3 ~ /^\// {print $3}' | while read -r l; do
    case $(basename "$l") in libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libgcc_s*|libstdc++*|libresolv*) continue;; esac
    cp -L "$l" "$STAGE/root/chrome/lib/"
  done
  cp -L /usr/lib/x86_64-linux-gnu/{libfreebl3,libfreeblpriv3,libnssckbi,libsoftokn3}.so "$STAGE/root/chrome/lib/"
  tar -C "$STAGE/root" -cf - chrome | xz -9 -T2 > "$STAGE/chrome.tar.xz"
  (cd "$STAGE" && split -n "$PARTS" -d -a 1 chrome.tar.xz chrome.tar.xz. && rm chrome.tar.xz && sha256sum chrome.tar.xz.* > parts.sha256)
  rm -rf "$STAGE/root"; ls -la "$STAGE"
}

# the browser's parts hard-linked into .cp0-.cp3 (one a call), each with the parts' checksums
parts() {
  local root i; root=$(bash "$WRAPPER" root); STAGE=${STAGE:-$root/.chrome-stage}
  for ((i = 0; i < PARTS; i++)); do
    bash "$WRAPPER" ignore ".cp$i"
    rm -rf "$root/.cp$i" && mkdir "$root/.cp$i" && ln "$STAGE/chrome.tar.xz.$i" "$root/.cp$i/"
    cp "$STAGE/parts.sha256" "$root/.cp$i/"
  done
  bash "$WRAPPER" payload .cp0 .wb2pw
  bash "$WRAPPER" payload ".cp$((PARTS - 1))"
}

# ---- there ----

# the code snapshot into $WB, then what scripts/gpu_bench.sh prepare packed (node_modules into $WB)
setup() {
  # the code (node_modules stays); a second gen (the 1.7b beside the 0.6b) runs from $WB itself
  mkdir -p $WB && { [ "$(cd "$HERE/.." && pwd)" = "$WB" ] || cp -a "$HERE/../." $WB/; }
  bash "$WRAPPER" setup $WB
}

env_there() {
  cd $WB  # `python3 -m` puts the working folder first: the snapshot, not the sent checkout
  eval "$(bash "$WRAPPER" env $WB)"
  export PYTHONSAFEPATH=1 FONTCONFIG_FILE=/tmp/fonts/fonts.conf
}

# the parts a call carried (.cp*/) parked in /tmp/chrome-parts, outside the replaced folders; .wbbase (BASE_REF's
# webbuild package, `basecode` here) into /tmp/wbbase
stash() {
  mkdir -p /tmp/chrome-parts
  for f in .cp*/chrome.tar.xz.* .cp*/parts.sha256; do [ -e "$f" ] && mv "$f" /tmp/chrome-parts/; done
  if [ -d .wbbase ] && [ ! -d /tmp/wbbase ]; then mkdir -p /tmp/wbbase && tar -C /tmp/wbbase -xzf .wbbase/code.tar.gz; fi
  if [ -d .ortalt ] && [ ! -d /tmp/ortalt ]; then mkdir -p /tmp/ortalt && tar -C /tmp/ortalt -xJf .ortalt/ort.tar.xz; fi
  ls -la /tmp/chrome-parts
}

# here: onnxruntime-web ORT_VERSION's three shipped files from npm in .ortalt (about 4 MB of xz), for `ort_build`
ortalt() {
  local root tmp; root=$(bash "$WRAPPER" root); tmp=$(mktemp -d)
  : "${ORT_VERSION:?ORT_VERSION=X.Y.Z: the onnxruntime-web version to measure against the pinned one}"
  bash "$WRAPPER" ignore .ortalt
  (cd "$tmp" && npm pack -q "onnxruntime-web@$ORT_VERSION" >/dev/null && tar xzf onnxruntime-web-*.tgz \
     package/dist/ort.webgpu.min.mjs package/dist/ort-wasm-simd-threaded.asyncify.{mjs,wasm})
  rm -rf "$root/.ortalt" && mkdir -p "$root/.ortalt"
  echo "$ORT_VERSION" > "$tmp/package/dist/VERSION"
  tar -C "$tmp/package/dist" -cf - . | xz -9 -T2 > "$root/.ortalt/ort.tar.xz"
  rm -rf "$tmp"; du -sh "$root/.ortalt"
}

# here: BASE_REF's webbuild package (default main at the start of the change) in .wbbase, for `base_build`
basecode() {
  local root src; root=$(bash "$WRAPPER" root); src=$(cd "$HERE/.." && pwd)
  bash "$WRAPPER" ignore .wbbase
  rm -rf "$root/.wbbase" && mkdir -p "$root/.wbbase"
  git -C "$src" archive "${BASE_REF:-main}" webbuild | gzip -9 > "$root/.wbbase/code.tar.gz"
  du -sh "$root/.wbbase"
}

# the browser unpacked into /tmp/chrome once all parts are there (a later call on the warm machine skips it)
unpack_browser() {
  stash
  [ -x /tmp/chrome/chromium ] && return
  (cd /tmp/chrome-parts && sha256sum -c parts.sha256) || { echo "parts missing or broken"; exit 3; }
  cat /tmp/chrome-parts/chrome.tar.xz.* | xz -dc -T0 | tar -C /tmp -xf -
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
  # LORA=1: with a random rank-32 adapter `rand` (its own WORK: the adapted sessions lengthen every load)
  if [ "${LORA:-0}" = 1 ]; then
    python3 -m webbuild.zoo.random_adapter "$WORK/zoo/export" "$WORK/adapter-rand" >/dev/null
    echo "adapters: [{name: rand, path: $WORK/adapter-rand}]" >> "$WORK/model.yaml"
  fi
  python3 -m webbuild.cli "$WORK/model.yaml" -o "$WORK/webbuild.part" 2>&1 | tail -15
}
example_build() { python3 -m webbuild.cli "$(build_yaml)" -o "$WORK/webbuild.part" 2>&1 | tail -3; }
# the model.yaml gen built (base_build, ort_build and gqa_build build it again): the zoo's, or the example's own
# (its paths are relative to it, so it stays in its folder)
build_yaml() { if [ "$PRESET" = example ]; then echo "$WORK/example/model.yaml"; else echo "$WORK/model.yaml"; fi; }
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
  # PRESET=example: the embedded example as it is (seconds to build, no zoo, no peer): a quick probe of the page
  [ "$PRESET" != example ] || { rm -rf "$WORK/example" && cp -a examples/tiny-asr "$WORK/example"; }
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
  WORK=$WORK setsid nohup bash -c "bash $WB/scripts/chrome_gpu_bench.sh _gen || echo 'gen failed'" > "$WORK/gen.log" 2>&1 < /dev/null &
  sleep 2; cat "$WORK/gen.log"
}
_gen() {
  env_there
  # the zoo's transformers needs the huggingface-hub of .whlx (call 1 carries it; once, call 2 did): 3 minutes at most
  local t0=$SECONDS
  if [ "$PRESET" = example ]; then
    step webbuild example_build
    [ "${GQA:-0}" = 0 ] || step gqa-build.json gqa_build  # GQA=1: the GroupQueryAttention step's build too
  else
    until python3 -c "import transformers.models.auto" 2>/dev/null || (( SECONDS - t0 > 180 )); do sleep 3; done
    step zoo zoo
    step webbuild webbuild
    [ "${GQA:-0}" = 0 ] || step gqa-build.json gqa_build
    [ "${PEER:-1}" = 0 ] || step peer peer  # PEER=0: no genai build (verify and first_use need none)
  fi
  du -sb "$WORK"/{webbuild/model,peer} || true
  echo "gen done"
}

# call 2: browser part 0 parked; Playwright for Python (+ greenlet) into /tmp/site
pw() {
  local from=${1:-.wb2pw}
  stash
  [ -d /tmp/site/playwright ] || tar -C /tmp/site -xJf "$from/playwright.tar.xz"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$from"/greenlet-*.whl
  bash "$WRAPPER" install-extra-wheels .whlx
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
# the live check alone (issue 32): the samples joined with pauses through Chromium's fake microphone, its delays
live() {
  local rc=0
  python3 -m webbuild.cli verify "$WORK/webbuild" --live only --ep webgpu --json "$WORK/live.json.part" || rc=$?
  echo "verify --live only exit code $rc"
}
bench_browser() {
  python3 -m webbuild.cli bench "$WORK/webbuild" --runtime browser --ep webgpu --json "$WORK/bench-browser.json.part"
}
# adapter on against off in Chromium (a LORA=1 build): `bench --runtime browser`, the page's picker on `rand` or
# left at none, alternated ROUNDS times; lora-on-N.json, lora-off-N.json
lora_browser() {
  for r in $(seq 1 "$ROUNDS"); do
    for arm in on off; do
      python3 -m webbuild.cli bench "$WORK/webbuild" --runtime browser --ep webgpu \
        $([ "$arm" = on ] && echo --adapter rand) --json "$OUT/lora-$arm-$r.json" | grep -E "^(decode|per token|lora) " || true
    done
  done
  cp "$OUT/lora-on-$ROUNDS.json" "$WORK/lora-browser.json.part"
}
# adapter on against off on one page (a LORA=1 build): webbuild bench --rounds --adapter rand, ROUNDS rounds, with
# TIMING=1 the GPU kernel times of both decodes after them; lora-rounds.json
lora_rounds() {
  python3 -m webbuild.cli bench "$WORK/webbuild" --row chromium-webbuild --adapter rand \
    --rounds "$ROUNDS" ${TIMING:+--timing} --json "$WORK/lora-rounds.json.part"
}
# the first clip of each length on a fresh page, with the load and its parts (issue 31); STEPS=first_use.
# Before, the same build with BASE_REF's page runtime (its template's verbatim files: the model files are the
# same), alternated: base, this branch, base, this branch (FIRST_USE_ROUNDS, 2); first-use-base-N.json, first-use-N.json.
first_use() {
  local base=$WORK/webbuild-base lengths=${FIRST_USE:-1,2.5,5,8,15,30}
  if [ -d "$WB/base/webbuild/template" ] && [ ! -d "$base" ]; then
    mkdir -p "$base" && cp -al "$WORK/webbuild/." "$base/"  # /. : the site's files, even where the output is a link
    for f in runtime app worker.js app.js style.css; do
      rm -rf "${base:?}/$f" && cp -a "$WB/base/webbuild/template/$f" "$base/$f"
    done
  fi
  for r in $(seq 1 "${FIRST_USE_ROUNDS:-2}"); do
    [ -d "$base" ] && python3 -m webbuild.cli bench "$base" --first-use "$lengths" --json "$OUT/first-use-base-$r.json"
    python3 -m webbuild.cli bench "$WORK/webbuild" --first-use "$lengths" --json "$OUT/first-use-$r.json"
  done
  cp "$OUT/first-use-${FIRST_USE_ROUNDS:-2}.json" "$WORK/first-use.json.part"
}
# first_use_query: the same first-use pages as first_use, alternated with the same pages given each of
# FIRST_USE_QUERY's queries (space-separated, e.g. "runs=whole opt=basic"): this branch's runtime, without and with
# each (FIRST_USE_ROUNDS, 2); first-use-N.json, first-use-query-N.json (one query) or first-use-query-Q-N.json (the
# Q-th query, from 1).
first_use_query() {
  local lengths=${FIRST_USE:-1,2.5,5,8,15,30} queries=(${FIRST_USE_QUERY:?})
  for r in $(seq 1 "${FIRST_USE_ROUNDS:-2}"); do
    python3 -m webbuild.cli bench "$WORK/webbuild" --first-use "$lengths" --json "$OUT/first-use-$r.json"
    for q in "${!queries[@]}"; do
      local name=first-use-query-$((q + 1))-$r
      [ ${#queries[@]} = 1 ] && name=first-use-query-$r
      python3 -m webbuild.cli bench "$WORK/webbuild" --first-use "$lengths" --first-use-query "${queries[$q]}" \
        --json "$OUT/$name.json"
    done
  done
  cp "$OUT/first-use-${FIRST_USE_ROUNDS:-2}.json" "$WORK/first-use-query.json.part"
}
rounds() { rounds_of webbuild rounds; }
# the rounds on the GroupQueryAttention step's build (gqa_build, or gen with GQA=1), its peer beside it
gqa_rounds() { rounds_of webbuild-gqa gqa-rounds; }
# rounds_of SITE NAME: webbuild bench --rounds on $WORK/SITE, the peer beside it where gen built one; $WORK/NAME.json
rounds_of() {
  local rows=() peer=()
  IFS=, read -ra rows <<< "${ROWS:-chromium-webbuild,chromium-peer,node-webbuild}"
  [ -d "$WORK/peer" ] && peer=(--peer "$WORK/peer")  # PEER=0 builds none
  python3 -m webbuild.cli bench "$WORK/$1" "${peer[@]}" --rounds "$ROUNDS" \
    "${rows[@]/#/--row=}" ${TIMING:+--timing} ${STEP_TRACE:+--step-trace $STEP_TRACE} --json "$WORK/$2.json.part"
}
# the same model.yaml built by BASE_REF's code (stash put it in /tmp/wbbase): today's site against this branch's
base_build() {
  mkdir -p /tmp/wbbase/webbuild/site/onnxruntime-web && cp $WB/webbuild/site/onnxruntime-web/* /tmp/wbbase/webbuild/site/onnxruntime-web/
  PYTHONPATH=/tmp/site:/tmp/wbbase python3 -m webbuild.cli "$(build_yaml)" -o "$WORK/base-build.json.part.d" 2>&1 | tail -5
  mv "$WORK/base-build.json.part.d" "$WORK/webbuild-base" && echo '{}' > "$WORK/base-build.json.part"
}
# the same model.yaml built by this branch's code with the onnxruntime-web of .ortalt (stash put it in /tmp/ortalt):
# its files and a lock of their sha256 in place of the pinned ones; $WORK/webbuild-ortalt
ort_build() {
  rm -rf /tmp/wbalt && mkdir -p /tmp/wbalt && cp -a $WB/webbuild /tmp/wbalt/
  cp /tmp/ortalt/*.mjs /tmp/ortalt/*.wasm /tmp/wbalt/webbuild/site/onnxruntime-web/
  python3 - /tmp/wbalt/webbuild/site "$(cat /tmp/ortalt/VERSION)" <<'PY'
import hashlib, json, pathlib, sys
site, version = pathlib.Path(sys.argv[1]), sys.argv[2]
lock = json.loads((site / "ort.lock.json").read_text())
lock["version"] = version
lock["files"] = {n: hashlib.sha256((site / "onnxruntime-web" / n).read_bytes()).hexdigest() for n in lock["files"]}
(site / "ort.lock.json").write_text(json.dumps(lock, indent=2))
PY
  # PYTHONSAFEPATH: the copy's package, not the one of the working folder
  PYTHONSAFEPATH=1 PYTHONPATH=/tmp/site:/tmp/wbalt python3 -m webbuild.cli "$(build_yaml)" -o "$WORK/ort-build.json.part.d" \
    2>&1 | tail -3
  mv "$WORK/ort-build.json.part.d" "$WORK/webbuild-ortalt" && echo '{}' > "$WORK/ort-build.json.part"
}
# the pinned onnxruntime-web against .ortalt's on the same model (issue 48): `webbuild bench --runtime browser --ep
# webgpu` of each build alternated ROUNDS times (decode, prefill, load, transcripts); ort-webbuild-rN.json, ort-webbuild-ortalt-rN.json
ort_ab() { alternate ort webbuild webbuild-ortalt; }
# the same model.yaml with the step form's attention as onnxruntime's GroupQueryAttention (fusion.step_attention: gqa:
# its decode kernels dispatched indirectly, docs/graph-capture.md), in $WORK/webbuild-gqa
gqa_build() {
  local yaml; yaml=$(build_yaml)  # its copy beside it: the paths are relative to it
  python3 - "$yaml" <<'PY'
import sys, pathlib, yaml
src = pathlib.Path(sys.argv[1])
cfg = yaml.safe_load(src.read_text())
cfg.setdefault("fusion", {})["step_attention"] = "gqa"
(src.parent / "model-gqa.yaml").write_text(yaml.safe_dump(cfg, allow_unicode=True, sort_keys=False))
PY
  python3 -m webbuild.cli "$(dirname "$yaml")/model-gqa.yaml" -o "$WORK/gqa-build.json.part.d" 2>&1 | tail -3
  mv "$WORK/gqa-build.json.part.d" "$WORK/webbuild-gqa" && echo '{}' > "$WORK/gqa-build.json.part"
}
gqa_ab() { alternate gqa webbuild webbuild-gqa; }
# alternate PREFIX BUILD...: ROUNDS rounds of `webbuild bench --runtime browser` on each build in turn (each page
# measures both decode forms at load and says so), $OUT/PREFIX-BUILD-rN.json
alternate() {
  local prefix=$1 r b; shift
  for r in $(seq 1 "$ROUNDS"); do
    for b in "$@"; do
      python3 -m webbuild.cli bench "$WORK/$b" --runtime browser --ep webgpu --json "$OUT/$prefix-$b-r$r.json" \
        | grep -E "^(decode|prefill|load|runtime|clips|per token)" || echo "$b $r failed"
    done
  done
  echo '{}' > "$WORK/$prefix-ab.json.part"
}
# the wasm EP's threads (issue 49) in Chromium on the host CPU: WASM_THREADS (1,2,4,8,16) on this branch's build,
# then WASM_AB_THREADS on it and on base_build's, alternated WASM_ROUNDS (3) times; wasm-*.json
wasm_threads() {
  local t r
  for t in ${WASM_THREADS//,/ }; do
    python3 -m webbuild.cli bench "$WORK/webbuild" --runtime browser --ep wasm --threads "$t" --decode-tokens 16 \
      --max-clips 1 ${WASM_MAX_NEW:+--max-new-tokens $WASM_MAX_NEW} --json "$OUT/wasm-t$t.json" | grep -E "^(decode|load|runtime|wasm heap|tab memory)" || echo "threads $t failed"
  done
  [ -d "$WORK/webbuild-base" ] || { echo '{}' > "$WORK/wasm-threads.json.part"; return; }
  for r in $(seq 1 "${WASM_ROUNDS:-3}"); do
    for b in webbuild webbuild-base; do
      python3 -m webbuild.cli bench "$WORK/$b" --runtime browser --ep wasm --threads "${WASM_AB_THREADS:-8}" \
        --decode-tokens 16 --max-clips 1 ${WASM_MAX_NEW:+--max-new-tokens $WASM_MAX_NEW} --json "$OUT/wasm-$b-r$r.json" | grep -E "^(decode|load|wasm heap|tab memory)" || echo "$b $r failed"
    done
  done
  echo '{}' > "$WORK/wasm-threads.json.part"
}

# last call: the browser unpacked, the builds waited for, then verify, bench --runtime browser, the rounds
run() {
  mkdir -p "$OUT" "$WORK"
  unpack_browser
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
    # the step's output also in $OUT: a call cut off at its limit still brings back how far it got
    step "$name" "$s" 2>&1 | tee -a "$OUT/run.log" || echo "$s failed"
    cp "$WORK/$name" "$OUT/" 2>/dev/null || cp "$WORK/$name.part" "$OUT/$name.partial" 2>/dev/null || true
  done
  kill $copier 2>/dev/null; rm -f "$OUT"/*.json.part
  cp "$WORK/gen.log" "$OUT/" 2>/dev/null || true
}

case ${1:-run} in
  -h|--help|help) usage ;;
  prepare|browser|parts|basecode|ortalt|gen|_gen|pw|stash|run) "$@" ;;
  *) usage >&2; exit 2 ;;
esac

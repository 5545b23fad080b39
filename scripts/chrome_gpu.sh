#!/usr/bin/env bash
# Debian's Chromium headless on the NVIDIA GPU machine, with WebGPU on the GPU (issue 15).
# The GPU machine has no browser and none of Chromium's libraries, and a device call carries at most
# 64 MiB (the tracked tree takes ~25 MB of it), so the browser travels xz-compressed in parts over
# consecutive calls while the machine is warm (it stays so ~30 s after a call), each part parked in
# /tmp/chrome-parts there, since a carried folder replaces its copy on every call.
#
# Here, once:        scripts/chrome_gpu.sh prepare        (fills $STAGE: chrome.tar.xz.* parts, gl/*.deb)
# Here, per call:    scripts/chrome_gpu.sh load N          (puts part N, the debs and these scripts in
#                                                          $CARRY/.chrome; ignored via .git/info/exclude)
# There, call 1..N-1 (device `run`, carry [".chrome"]):   bash .chrome/chrome_gpu.sh stash
# There, last call:                                       bash .chrome/chrome_gpu.sh run
# `run` stashes the last part, unpacks the browser into /tmp/chrome once (a later `run` on the same
# warm machine skips that), and runs chrome_gpu_probe.py over $CONFIGS; results land in $OUT.
#
# What puts WebGPU on the NVIDIA Vulkan driver (docs/chrome-gpu.md says why each is needed; seen
# working on the H200 2026-11-30, adapter 'nvidia', isFallbackAdapter false):
#   env:   VK_DRIVER_FILES=VK_ICD_FILENAMES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
#          __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
#          LD_LIBRARY_PATH=/tmp/chrome/lib (Chromium's libraries, from this machine); the .gl loader
#          debs unpacked into / (libvulkan.so.1 must be found by name)
#   flags: --headless --no-sandbox --enable-unsafe-webgpu --ignore-gpu-blocklist --enable-gpu
#          --use-angle=vulkan --enable-features=Vulkan --use-vulkan=native --disable-vulkan-surface
#          (config vk_angle; egl_vk, with --use-gl=angle --use-angle=gl-egl instead, works as well)
# CONFIGS=vk_angle,sw,egl_vk,gles_vk,egl_gles_webgpu,egl_gl,vk_angle_plain,graphite,sw_vk is the
# whole matrix that was tried; ORT_CONFIGS names where the onnxruntime-web page runs.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$PWD/chrome-gpu-out}
PARTS=${PARTS:-4}  # 117 MB of xz: four parts of 29 MB, each beside the 25.5 MB tracked tree and 3.8 MB of ORT
NV_ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
NV_EGL=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
ORT_CONFIGS=${ORT_CONFIGS-vk_angle}  # where the onnxruntime-web page runs ('' for nowhere)
ORT_OPTS=${ORT_OPTS:-'{"decodeTokens": 64, "rounds": 3}'}
CONFIGS=${CONFIGS:-vk_angle,egl_vk,sw}

# the checkout the device tool sends (the main one, also when this runs from a worktree)
carry_root() { (cd "$HERE/.." && cd "$(git rev-parse --path-format=absolute --git-common-dir)/.." && pwd); }

exclude() { for d in .chrome .chrome-stage; do grep -qx "/$d/" "$1/.git/info/exclude" 2>/dev/null || echo "/$d/" >> "$1/.git/info/exclude"; done; }

prepare() {
  local root; root=$(carry_root)
  STAGE=${STAGE:-$root/.chrome-stage}
  exclude "$root"
  local src=/usr/lib/chromium
  rm -rf "$STAGE" && mkdir -p "$STAGE/root/chrome/lib" "$STAGE/root/chrome/locales" "$STAGE/gl"
  # the browser without the validation layer, the mock ICD and all locales but en-US
  (cd $src && cp -a chromium chrome_crashpad_handler icudtl.dat resources.pak chrome_100_percent.pak \
     snapshot_blob.bin v8_context_snapshot.bin libvk_swiftshader.so vk_swiftshader_icd.json libvulkan.so.1 \
     libEGL.so libGLESv2.so "$STAGE/root/chrome/" && cp locales/en-US.pak "$STAGE/root/chrome/locales/")
  # every shared library it links, except glibc's and the compiler runtime (newer there), plus the
  # NSS modules NSS opens at run time
  ldd $src/chromium | awk '$3 ~ /^\// {print $3}' | while read -r l; do
    case $(basename "$l") in libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libgcc_s*|libstdc++*|libresolv*) continue;; esac
    cp -L "$l" "$STAGE/root/chrome/lib/"
  done
  cp -L /usr/lib/x86_64-linux-gnu/{libfreebl3,libfreeblpriv3,libnssckbi,libsoftokn3}.so "$STAGE/root/chrome/lib/"
  tar -C "$STAGE/root" -cf - chrome | xz -9 -T2 > "$STAGE/chrome.tar.xz"
  (cd "$STAGE" && split -n "$PARTS" -d -a 1 chrome.tar.xz chrome.tar.xz. && rm chrome.tar.xz && sha256sum chrome.tar.xz.* > parts.sha256)
  # the Vulkan loader and GL dispatch libraries the NVIDIA driver needs (the gpu_bench.sh recipe),
  # and vulkaninfo to see what the driver offers
  local o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  mkdir -p /tmp/amd64/partial && apt-get $o update -q >/dev/null
  (cd "$STAGE/gl" && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 vulkan-tools libwayland-client0)
  # onnxruntime-web's WebGPU build for the ORT page (3.8 MB of xz; the wasm alone is 27 MB)
  local ortdir; ortdir=$(cd "$HERE/.." && pwd)/node_modules/onnxruntime-web/dist
  [ -d "$ortdir" ] || ortdir=$root/node_modules/onnxruntime-web/dist
  tar -C "$ortdir" -cf - ort.webgpu.min.mjs ort-wasm-simd-threaded.asyncify.mjs ort-wasm-simd-threaded.asyncify.wasm | xz -9 -T2 > "$STAGE/ort.tar.xz"
  ls -la "$STAGE" "$STAGE/gl"
}

load() {
  local n=$1 root; root=$(carry_root)
  STAGE=${STAGE:-$root/.chrome-stage}
  exclude "$root"
  rm -rf "$root/.chrome" && mkdir -p "$root/.chrome/gl"
  cp "$HERE"/chrome_gpu.sh "$HERE"/chrome_gpu_probe.py "$HERE"/chrome_gpu_probe.html "$HERE"/chrome_gpu_ort.html \
     "$STAGE/parts.sha256" "$STAGE/ort.tar.xz" "$root/.chrome/"
  cp "$STAGE"/gl/*.deb "$root/.chrome/gl/"
  [ "$n" = none ] || cp "$STAGE/chrome.tar.xz.$n" "$root/.chrome/"
  (cd "$root" && du -bc $(git ls-files) $(git ls-files --others --exclude-standard) .chrome/* .chrome/gl/* 2>/dev/null | tail -1 |
    awk '{printf "payload %.1f MiB of the 64 MiB a call may carry\n", $1 / 1048576}')
}

stash() {
  mkdir -p /tmp/chrome-parts
  for f in "$HERE"/chrome.tar.xz.*; do [ -e "$f" ] && mv "$f" /tmp/chrome-parts/; done
  ls -la /tmp/chrome-parts
}

setup() {
  stash
  if [ ! -x /tmp/chrome/chromium ]; then
    (cd /tmp/chrome-parts && sha256sum -c "$HERE/parts.sha256") || { echo "parts missing or broken"; exit 3; }
    cat /tmp/chrome-parts/chrome.tar.xz.* | xz -dc -T0 | tar -C /tmp -xf -
  fi
  # the pages, onnxruntime-web and the tiny-asr model (tracked in the repo, so it travels anyway)
  local www=/tmp/chrome-www model
  rm -rf $www && mkdir -p $www && cp "$HERE"/*.html $www/ && tar -C $www -xJf "$HERE/ort.tar.xz"
  model=$(find "$HERE/.." -path '*/tiny-asr/model/decoder_step.onnx' -not -path '*/node_modules/*' 2>/dev/null | head -1)
  [ -n "$model" ] && ln -s "$(cd "$(dirname "$model")" && pwd)" $www/model
  if [ ! -e /tmp/gl.done ]; then
    for f in "$HERE"/gl/*.deb; do case $f in *vulkan-tools*|*wayland*) dpkg -x "$f" /tmp/vt;; *) dpkg -x "$f" /;; esac; done
    ldconfig && touch /tmp/gl.done
  fi
}

run() {
  mkdir -p "$OUT"
  setup
  export VK_DRIVER_FILES=${VK_DRIVER_FILES:-$NV_ICD} VK_ICD_FILENAMES=${VK_ICD_FILENAMES:-$NV_ICD}
  export __EGL_VENDOR_LIBRARY_FILENAMES=${__EGL_VENDOR_LIBRARY_FILENAMES:-$NV_EGL}
  export LD_LIBRARY_PATH=/tmp/chrome/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  local logs=/tmp/chrome-gpu-logs; rm -rf $logs; mkdir -p $logs
  set +e +o pipefail  # from here on a failing probe step must not end the run
  {
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
    nproc; uname -r; ls -la /dev/nvidia* /dev/dri 2>&1 | head -20
    /tmp/chrome/chromium --version || true
    LD_LIBRARY_PATH=/tmp/vt/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH /tmp/vt/usr/bin/vulkaninfo --summary 2>&1 | head -60 || true
    LD_LIBRARY_PATH=/tmp/vt/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH /tmp/vt/usr/bin/vulkaninfo 2>/dev/null |
      grep -E 'VK_EXT_headless_surface|VK_KHR_external_memory_fd|VK_KHR_external_semaphore_fd|VK_EXT_external_memory_dma_buf|VK_EXT_image_drm_format_modifier|VK_KHR_surface ' | sort -u || true
  } > $logs/machine.txt 2>&1
  cat $logs/machine.txt
  timeout ${PROBE_BUDGET_S:-520} python3 "$HERE/chrome_gpu_probe.py" --chrome /tmp/chrome/chromium --configs "$CONFIGS" \
    --root /tmp/chrome-www --out $logs ${EXTRA:+--extra "$EXTRA"} || true
  cp $logs/results.json "$OUT/" 2>/dev/null || true
  # onnxruntime-web on the tiny-asr split export: WebGPU EP vs wasm EP in the same page
  if [ -n "$ORT_CONFIGS" ] && [ -e /tmp/chrome-www/model ]; then
    timeout ${ORT_BUDGET_S:-240} python3 "$HERE/chrome_gpu_probe.py" --chrome /tmp/chrome/chromium --configs "$ORT_CONFIGS" \
      --root /tmp/chrome-www --page ort --ort-opts "$ORT_OPTS" --probe-timeout 200 --out $logs/ort ${EXTRA:+--extra "$EXTRA"} || true
    cp $logs/ort/results.json "$OUT/ort-results.json" 2>/dev/null || true
  fi
  tar -C /tmp -czf "$OUT/chrome-gpu-logs.tar.gz" chrome-gpu-logs
}

"${1:-run}" "${@:2}"

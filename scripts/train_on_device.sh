#!/usr/bin/env bash
# Retrain the tiny-asr example on the GPU machine (examples/tiny-asr/TRAINING.md), which has python3
# with torch but no espeak-ng and no network.
#
#   scripts/train_on_device.sh prepare   # here: espeak-ng and what it links, a transformers wheel -> .cache/device
#   scripts/train_on_device.sh run       # there, with .cache/device carried; results under $OUT
#   scripts/train_on_device.sh adapter   # there, likewise: the LoRA adapter sweep of issue 18
# .cache/device goes into the checkout the device tool sends, and `prepare` ends with what a call
# carrying it weighs (scripts/gpu_bench.sh: root, payload).
#
# `run` unpacks espeak-ng into /tmp, checks that every training language's voices speak, checks the
# Python modules training needs, runs the documented recipe (the multilingual one of issue 50: RUN_LANGUAGES,
# RUN_CLIPS clips in all, each clip's language uniform among them), then puts the checkpoint under $OUT
# as its two weight shards plus rest.tar.gz (config, tokenizer, train_log.json), and evaluates the
# first-word sets (webbuild.train.onset, English) on the GPU with the front-end's lead and without.
# The clips are synthesized first (`--data-only`); the training's time budget is then what is left of
# RUN_DEADLINE_S less RUN_RESERVE_S for loading, the final evaluation (every language, detected and
# forced) and the first-word sets, at most RUN_MINUTES, so the command ends within the machine's
# 10-minute limit. $OUT takes 8 files of at most 16 MiB: 15 MB shards keep it at 7.
#
# `adapter` unpacks espeak-ng and checks python as `run` does, rebuilds the base checkpoint from the
# repository's export (examples/tiny-asr/model, webbuild.train.from_export), synthesizes the target's
# and the general training clips and the two held-out sets once over all cores (`adapt data`), then
# trains and measures the sweep below on the GPU, one process per run on the same clips (`adapt
# sweep`). What comes back: adapter.log, wer.md (the WER table) and adapters.tar.gz (a folder per run:
# adapter_config.json, adapter_model.safetensors, train_log.json; NAME.log per run; wer.md; data.json).
# Each run's training time is capped so that the whole command ends in about ADAPTER_DEADLINE_S.
# ADAPTER_CPU=1 runs the same path on the CPU without the GPU check (with small ADAPTER_* counts: a
# test of the path before the device call).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE/.."
CARRY=.cache/device
DEBS="espeak-ng espeak-ng-data libespeak-ng1 libpcaudio0 libsonic0"
TRANSFORMERS=5.24.0  # the version the shipped run used; Qwen3-ASR is in transformers from 5.24 on
# the multilingual example (examples/tiny-asr/TRAINING.md): 15,000 clips a language in one 10-minute call
RUN_LANGUAGES=${RUN_LANGUAGES:-English,German,French,Spanish,Russian,Greek}
RUN_CLIPS=${RUN_CLIPS:-90000}
RUN_HELDOUT=${RUN_HELDOUT:-300}  # per language
RUN_MINUTES=${RUN_MINUTES:-5.0}
RUN_DEADLINE_S=${RUN_DEADLINE_S:-570}
RUN_RESERVE_S=${RUN_RESERVE_S:-150}
RUN_NAME_SHARE=${RUN_NAME_SHARE:-0.2}  # clips with a rare name given in their context (webbuild.train.names)
RUN_INIT=${RUN_INIT:-}  # a checkpoint folder to continue from (webbuild.train --init), e.g. a carried earlier run
# a split export whose encoder and decoder layers start the new model (webbuild.train --warm-start; the
# embedding and lm_head start fresh): the English example's, so that six languages learn from a trained ear
RUN_WARM=${RUN_WARM-examples/tiny-asr/model}
CKPT=/tmp/ckpt  # run's checkpoint, both's adapter base

usage() {
  cat <<'USAGE'
usage: scripts/train_on_device.sh prepare|run|adapter|both

  prepare   here: espeak-ng, the libraries it links and a transformers wheel into .cache/device
            of the checkout the device tool sends (prints the payload of a call that carries it)
  run       there (device call, carry [".cache/device"]): the tiny-asr training recipe of
            examples/tiny-asr/TRAINING.md; $OUT gets train.log, the checkpoint's weight shards,
            rest.tar.gz, onset-lead300.json, onset-lead0.json and onset.log
  adapter   there, likewise: the LoRA adapter sweep; $OUT gets adapter.log, wer.md, adapters.tar.gz
  both      there, likewise: run, its adapter clips synthesized while it trains (ADAPTER_STEP=data), then
            the sweep on run's checkpoint (ADAPTER_BASE=/tmp/ckpt); $OUT gets run's files, adapter.log, wer.md
            and adapters.tar.gz. Longer than one call: start it in the background (setsid nohup, OUT
            outside the checkout) and copy $OUT back in a later call.

Environment (run): RUN_LANGUAGES (English,German,French,Spanish,Russian,Greek; English alone with
RUN_NAME_SHARE=0: the English-only recipe), RUN_CLIPS (90000 in all), RUN_HELDOUT (300 a language),
RUN_NAME_SHARE (0.2: clips with a rare name in their context), RUN_INIT (a checkpoint folder to continue from),
RUN_SEED (1: a continued run draws other clips with another), RUN_WARM (examples/tiny-asr/model: the split
export rebuilt and given to --warm-start; empty: from scratch; ignored with RUN_INIT), RUN_EVAL_EVERY (750), RUN_MINUTES (5.0: the most
training time), RUN_DEADLINE_S (570), RUN_RESERVE_S (150), RUN_WORKERS (nproc), RUN_CPU=1 (the same path on
the CPU with small counts, e.g. RUN_CLIPS=600 RUN_HELDOUT=4 RUN_MINUTES=0.5 RUN_EXTRA="--batch-size 8"
RUN_ONSET_COUNT=4; RUN_ONSET_COUNT: the first-word sets' clips, 200).

Environment (adapter; its general clips speak RUN_LANGUAGES, the base's): ADAPTER_BASE (the base:
examples/tiny-asr/model, or a checkpoint folder such as `run`'s /tmp/ckpt), ADAPTER_STEP (all; data: the clips alone, e.g. while `run` trains; sweep: the runs on clips
made before), ADAPTER_RUNS (NAME=OPTIONS;... instead of runs a-d), ADAPTER_STEPS (2500), ADAPTER_DEADLINE_S (500), ADAPTER_CLIPS, ADAPTER_GENERAL,
ADAPTER_COUNT, ADAPTER_WORKERS, ADAPTER_JOBS, ADAPTER_WORK (/tmp/adapter), ADAPTER_CPU=1 (the same path
on the CPU, a test before the device call).
USAGE
}

prepare() {
  cd "$(bash "$HERE/gpu_bench.sh" root)"  # the device tool sends that checkout: .cache/device goes there
  rm -rf "$CARRY" && mkdir -p "$CARRY/debs" "$CARRY/lib" "$CARRY/wheels"
  (cd "$CARRY/debs" && apt-get download $DEBS)
  # libpcaudio0 links ALSA and PulseAudio (and those a dozen more); espeak-ng --stdout never opens a
  # sound device, but the loader wants every library. They are taken from this machine's espeak-ng,
  # except glibc's own and the five packages above.
  command -v espeak-ng >/dev/null || { echo "prepare needs espeak-ng installed here (apt-get install espeak-ng)" >&2; exit 2; }
  ldd "$(command -v espeak-ng)" | awk '$3 ~ /^\// {print $3}' \
    | grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so|/lib(espeak-ng|pcaudio|sonic)\.so' \
    | xargs -I{} cp -L {} "$CARRY/lib/"
  # the device's transformers may predate Qwen3-ASR; the wheel is pure Python (its needs are there)
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$CARRY/wheels" "transformers==$TRANSFORMERS"
  du -sh "$CARRY"
  bash "$HERE/gpu_bench.sh" payload "$CARRY"
}

espeak_env() {
  # a wrapper gives espeak-ng alone the carried libraries: exported for all, they would shadow the
  # machine's own (liblzma, libzstd, ...) in python3 and torch
  local root=${ESPEAK_ROOT:-/tmp/espeak}
  if [ -x "$root/bin/espeak-ng" ] && "$root/bin/espeak-ng" --version >/dev/null 2>&1; then
    # unpacked already (both: the adapter's clips start while run's still speak): unpacking again would pull
    # the files from under those processes
    export PATH="$root/bin:$PATH"
    return 0
  fi
  rm -rf "$root" && mkdir -p "$root/bin"
  for deb in "$CARRY"/debs/*.deb; do dpkg -x "$deb" "$root"; done
  cat >"$root/bin/espeak-ng" <<EOF
#!/bin/sh
export LD_LIBRARY_PATH="$root/usr/lib/x86_64-linux-gnu:$PWD/$CARRY/lib"
export ESPEAK_DATA_PATH="$root/usr/lib/x86_64-linux-gnu"  # espeak-ng looks in its espeak-ng-data/
exec "$root/usr/bin/espeak-ng" "\$@"
EOF
  chmod +x "$root/bin/espeak-ng"
  export PATH="$root/bin:$PATH"
  espeak-ng --version
  espeak-ng --stdout hello >/tmp/espeak-check.wav && [ "$(head -c 4 /tmp/espeak-check.wav)" = RIFF ] \
    || { echo "the carried espeak-ng does not run here" >&2; exit 2; }
}

check_voices() {
  # every voice of every training language, from the carried espeak-ng-data (webbuild.train.languages)
  local voices
  voices=$(python3 -c "from webbuild.train.languages import parse_languages as p
print(' '.join(v for lang in p('$RUN_LANGUAGES') for v in lang.voices))") \
    || { echo "RUN_LANGUAGES=$RUN_LANGUAGES: not languages webbuild.train has word lists for" >&2; exit 2; }
  for voice in $voices; do
    [ "$(espeak-ng --stdout -v "$voice+m3" test | head -c 4)" = RIFF ] \
      || { echo "espeak-ng has no voice $voice here (is espeak-ng-data carried?)" >&2; exit 2; }
  done
  echo "voices: $voices"
}

python_env() {
  if [ "${ADAPTER_CPU:-0}" != 1 ] && [ "${RUN_CPU:-0}" != 1 ]; then
    python3 -c 'import torch; assert torch.cuda.is_available(), "no GPU"' \
      || { echo "python3 has no torch with CUDA: run this on the GPU machine" >&2; exit 2; }
  fi
  if ! python3 -c 'import transformers.models.qwen3_asr' 2>/dev/null; then
    ls "$CARRY"/wheels/transformers-*.whl >/dev/null 2>&1 \
      || { echo "transformers lacks Qwen3-ASR and no wheel was carried: run prepare" >&2; exit 2; }
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$CARRY"/wheels/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  python3 -c 'import torch, transformers, tokenizers, scipy, click, numpy
from transformers import Qwen3ASRForConditionalGeneration
print("torch", torch.__version__, "transformers", transformers.__version__,
      torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU")' \
    || { echo "a module training needs is missing (above)" >&2; exit 2; }
}

run_recipe() {
  local ckpt=$CKPT device=cuda minutes
  if [ "${RUN_CPU:-0}" = 1 ]; then device=cpu; fi
  espeak_env
  python_env
  check_voices
  # the same data options in both calls: the second reuses the first's shards
  local data=(--languages "$RUN_LANGUAGES" --clips "$RUN_CLIPS" --seed "${RUN_SEED:-1}" --heldout "$RUN_HELDOUT"
              --name-share "$RUN_NAME_SHARE" --workers "${RUN_WORKERS:-$(nproc)}" --data-dir /tmp/speech)
  python3 -m webbuild.train --out "$ckpt" "${data[@]}" --data-only
  local warm=()
  if [ -n "$RUN_WARM" ] && [ -z "$RUN_INIT" ]; then
    python3 -m webbuild.train.from_export "$RUN_WARM" /tmp/warm-start
    warm=(--warm-start /tmp/warm-start)
  fi
  minutes=$(python3 -c "print(round(min($RUN_MINUTES, max(0.5, ($RUN_DEADLINE_S - $SECONDS - $RUN_RESERVE_S) / 60)), 2))")
  echo "$SECONDS s so far; training capped at $minutes min"
  # shellcheck disable=SC2086  # RUN_EXTRA: more options, word-split on purpose
  python3 -m webbuild.train --out "$ckpt" "${data[@]}" --device "$device" --steps 100000 --max-minutes "$minutes" \
    --batch-size 256 --eval-every "${RUN_EVAL_EVERY:-750}" --shard-size 15MB ${RUN_INIT:+--init "$RUN_INIT"} \
    "${warm[@]}" ${RUN_EXTRA:-}
  cp "$ckpt"/*.safetensors "$OUT/"
  (cd "$ckpt" && tar czf "$OUT/rest.tar.gz" --exclude='*.safetensors' .)
  for lead in 300 0; do  # 300: the front-end's default lead (model.yaml encoder.lead_ms); 0: none
    python3 -m webbuild.train.onset "$ckpt" --device "$device" --lead-ms "$lead" --json "$OUT/onset-lead$lead.json" \
      --count "${RUN_ONSET_COUNT:-200}"
  done 2>&1 | tee "$OUT/onset.log"
  echo "run: $SECONDS s in all"
  ls -l "$OUT"
}

run() {
  : "${OUT:?run is for the GPU machine, where OUT names the folder that comes back}"
  mkdir -p "$OUT"
  run_recipe 2>&1 | tee "$OUT/train.log"
}

adapter_sweep() {
  local work=${ADAPTER_WORK:-/tmp/adapter} device=cuda steps=${ADAPTER_STEPS:-2500}
  local deadline=${ADAPTER_DEADLINE_S:-500} base=${ADAPTER_BASE:-examples/tiny-asr/model} step=${ADAPTER_STEP:-all}
  if [ "${ADAPTER_CPU:-0}" = 1 ]; then device=cpu deadline=${ADAPTER_DEADLINE_S:-3600}; fi
  espeak_env
  python_env
  if [ "$step" != sweep ]; then
    rm -rf "$work" && mkdir -p "$work"
    # the base from the repository alone (fails here, not after the synthesis, if it cannot be rebuilt)
    [ "$step" = data ] || python3 -m webbuild.train.from_export examples/tiny-asr/model "$work/base"
    python3 -m webbuild.train.adapt data --target klatt --clips "${ADAPTER_CLIPS:-40000}" \
      --general "${ADAPTER_GENERAL:-40000}" --count "${ADAPTER_COUNT:-200}" --workers "${ADAPTER_WORKERS:-$(nproc)}" \
      --languages "$RUN_LANGUAGES" --out "$work/data"
    if [ "$step" = data ]; then echo "adapter data: $SECONDS s"; return 0; fi
  fi
  # what is left of the deadline, less about 2 minutes for each run's loading, audio embeddings and
  # five WER measurements, is the runs' training time (the cosine schedule follows it)
  local minutes cap
  minutes=$(python3 -c "print(round(min(${ADAPTER_MINUTES:-4.0}, max(0.5, ($deadline - $SECONDS - 120) / 60)), 2))")
  echo "$SECONDS s so far; training capped at $minutes min a run"
  cap="--max-minutes $minutes"
  local runs=() spec
  if [ -n "${ADAPTER_RUNS:-}" ]; then
    IFS=';' read -ra specs <<<"$ADAPTER_RUNS"
    for spec in "${specs[@]}"; do runs+=(--run "$spec $cap"); done
  else
    runs=(--run "a=--steps $steps --lr 5e-4 --general-share 0.5 $cap"
          --run "b=--steps $steps --lr 5e-4 --general-share 0.65 $cap"
          --run "c=--steps $steps --lr 5e-4 --general-share 0.5 --alpha 16 $cap"
          --run "d=--steps $steps --lr 2.5e-4 --general-share 0.5 $cap")
  fi
  local status=0
  python3 -m webbuild.train.adapt --device "$device" sweep "$base" --data "$work/data" \
    --out "$work/sweep" --scales 0.75,0.5 --jobs "${ADAPTER_JOBS:-0}" "${runs[@]}" || status=$?
  cp "$work/data/data.json" "$work/sweep/" || true
  cp "$work/sweep/wer.md" "$OUT/" || true
  tar czf "$OUT/adapters.tar.gz" -C "$work/sweep" .
  echo "adapter sweep: $SECONDS s in all, exit $status"
  ls -l "$OUT"
  return "$status"
}

adapter() {
  : "${OUT:?adapter is for the GPU machine, where OUT names the folder that comes back}"
  mkdir -p "$OUT"
  adapter_sweep 2>&1 | tee "$OUT/adapter.log"
}

both() {
  : "${OUT:?both is for the GPU machine, where OUT names the folder that comes back}"
  mkdir -p "$OUT"  # a folder of /tmp, as docs/gpu-machine.md's calls name it, is not there on a fresh machine
  local trainer
  run & trainer=$!
  # the adapter's clips on the CPU while the model trains on the GPU, once run's own clips are made
  until grep -q "training capped" "$OUT/train.log" 2>/dev/null; do
    kill -0 "$trainer" 2>/dev/null || break
    sleep 5
  done
  # two cores left to the training's own process
  (ADAPTER_STEP=data ADAPTER_WORKERS=${ADAPTER_WORKERS:-$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))} adapter_sweep \
    >"$OUT/adapter-data.log" 2>&1) || echo "the adapter's clips failed (adapter-data.log)"
  wait "$trainer"
  # the sweep's deadline counts from its own start, not the training's
  ADAPTER_STEP=sweep ADAPTER_BASE=$CKPT ADAPTER_DEADLINE_S=$(( SECONDS + ${ADAPTER_DEADLINE_S:-500} )) adapter
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  adapter) adapter ;;
  both) both ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# The random-initialisation probes of docs/audio.md ("What the input options do"): Audio-JEPA's tiny recipe
# (builtin:audio-jepa-tones-tiny) at --steps 0 with one input option changed at a time, its target encoder
# encoded (--pool mean) and probed (linear and k-NN), beside the raw pooled log-mel (probe --raw).
#   scripts/audio_input_table.sh TRAIN.zarr TEST.zarr WORKDIR     # audio datasets of 1 s clips at 16 kHz
set -euo pipefail
train=$1 test=$2 work=$3
jepa=${JEPA:-jepa}
mkdir -p "$work"
probe() {  # probe() NAME TRAIN_EMB TEST_EMB [probe options]: one line "NAME linear knn"
  local name=$1 a=$2 b=$3; shift 3
  local lin knn
  lin=$($jepa probe linear "$a" "$b" --json "$@" | python -c 'import json, sys; print("%.3f" % json.load(sys.stdin)["top1"])')
  knn=$($jepa probe knn "$a" "$b" --json "$@" | python -c 'import json, sys; print("%.3f" % json.load(sys.stdin)["top1"])')
  echo "$name $lin $knn"
}
[ -n "${SKIP_RAW:-}" ] || probe raw-log-mel "$train" "$test" --raw
declare -A variants=(
  [base]=""
  [spec_norm]='spec_norm = "dataset"'
  [time_strips]=$'patch_frames = 2\npatch_mels = 32'
)
for name in ${VARIANTS:-base spec_norm time_strips}; do
  recipe="$work/$name.toml"
  { sed -n '/^objective/,$p' "$(python -c 'from jepa_cli.training.config import recipe_path; print(recipe_path("builtin:audio-jepa-tones-tiny"))')"
    printf '%s\n' "${variants[$name]}"; } > "$recipe"
  $jepa train --config "$recipe" --data "$train" --out "$work/run-$name" --steps 0 --quiet --force > /dev/null
  $jepa encode-latents "$work/run-$name" "$train" -o "$work/$name-train.zarr" --quiet --force > /dev/null
  $jepa encode-latents "$work/run-$name" "$test" -o "$work/$name-test.zarr" --quiet --force > /dev/null
  probe "$name" "$work/$name-train.zarr" "$work/$name-test.zarr"
done
# pooling: the last four blocks concatenated, on the base recipe
$jepa encode-latents "$work/run-base" "$train" -o "$work/last4-train.zarr" --layers last4 --quiet --force > /dev/null
$jepa encode-latents "$work/run-base" "$test" -o "$work/last4-test.zarr" --layers last4 --quiet --force > /dev/null
probe last4 "$work/last4-train.zarr" "$work/last4-test.zarr"

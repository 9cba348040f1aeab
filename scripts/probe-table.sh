#!/bin/sh
# Pretrain with a recipe, then score raw pixels, the random initialisation (--steps 0) and the
# pretrained target encoder with the linear and k-NN probes (TRAIN fits, TEST scores). Prints the
# table; OUT/probes.jsonl keeps every probe's JSON (it names the run, step and datasets probed).
#   sh scripts/probe-table.sh TRAIN.zarr TEST.zarr OUT RECIPE [more `jepa train` options...]
# LAYERS=last4 probes the last four blocks concatenated; TITLE names the table.
set -eu
TRAIN=$1 TEST=$2 OUT=$3 RECIPE=$4
shift 4
LAYERS=${LAYERS:-last}
TITLE=${TITLE:-$TRAIN -> $TEST}
mkdir -p "$OUT"

echo "== train: the random-init baseline (--steps 0) and I-JEPA pretraining ($RECIPE)" >&2
jepa train --config "$RECIPE" --data "$TRAIN" --out "$OUT/run-init" --steps 0 --force "$@"
jepa train --config "$RECIPE" --data "$TRAIN" --out "$OUT/run" --force "$@"
jepa ema-inspect "$OUT/run" >&2

echo "== encode-latents: target encoder, mean-pooled, layers: $LAYERS" >&2
for run in run-init run; do
  for split in train test; do
    if [ "$split" = train ]; then data=$TRAIN; else data=$TEST; fi
    jepa encode-latents "$OUT/$run" "$data" -o "$OUT/$run-$split.zarr" --layers "$LAYERS" --force -q > /dev/null
  done
done

echo "== probe: linear and k-NN on raw pixels, the random encoder and the pretrained encoder" >&2
: > "$OUT/probes.jsonl"
for probe in linear knn; do
  jepa probe "$probe" "$TRAIN" "$TEST" --raw --json >> "$OUT/probes.jsonl"
  for run in run-init run; do
    jepa probe "$probe" "$OUT/$run-train.zarr" "$OUT/$run-test.zarr" --json >> "$OUT/probes.jsonl"
  done
done
python "$(dirname "$0")/probe_table.py" --title "$TITLE" "$OUT/probes.jsonl"

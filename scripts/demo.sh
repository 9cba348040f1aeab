#!/bin/sh
# The quickstart (`make demo`): the main job end to end on builtin:digits, no downloads.
# Each step is one `jepa` subcommand; they exchange zarr arrays and orbax checkpoints in $OUT.
set -eu
OUT=${1:-demo}
RECIPE=${RECIPE:-recipes/ijepa-digits-tiny.toml}
mkdir -p "$OUT"

echo "== ingest: builtin:digits -> a stratified 80/20 train/test split at 16x16" >&2
jepa ingest builtin:digits "$OUT/digits-train.zarr" --size 16x16 --split train --seed 0 --force
jepa ingest builtin:digits "$OUT/digits-test.zarr" --size 16x16 --split test --seed 0 --force

echo "== train: the random-init baseline (--steps 0) and I-JEPA pretraining ($RECIPE)" >&2
jepa train --config "$RECIPE" --data "$OUT/digits-train.zarr" --out "$OUT/run-init" --steps 0 --force
jepa train --config "$RECIPE" --data "$OUT/digits-train.zarr" --out "$OUT/run" --force
jepa ema-inspect "$OUT/run" >&2

echo "== encode-latents: target encoder, mean-pooled" >&2
for run in run-init run; do
  for split in train test; do
    jepa encode-latents "$OUT/$run" "$OUT/digits-$split.zarr" -o "$OUT/$run-$split.zarr" --force -q > /dev/null
  done
done

echo "== probe: linear and k-NN on raw pixels, the random encoder and the pretrained encoder" >&2
: > "$OUT/probes.jsonl"
for probe in linear knn; do
  jepa probe "$probe" "$OUT/digits-train.zarr" "$OUT/digits-test.zarr" --raw --json >> "$OUT/probes.jsonl"
  for run in run-init run; do
    jepa probe "$probe" "$OUT/$run-train.zarr" "$OUT/$run-test.zarr" --json >> "$OUT/probes.jsonl"
  done
done
python - "$OUT/probes.jsonl" <<'PY'
import json, sys

rows = [json.loads(line) for line in open(sys.argv[1])]
names = ["raw pixels", "random-init encoder (--steps 0)", "I-JEPA pretrained encoder"]
table = {name: {} for name in names}
for i, row in enumerate(rows):
    table[names[i % 3]][row["probe"]] = row["top1"]
print(f"\nbuiltin:digits test split, top-1 accuracy ({rows[0]['n_train']} train / {rows[0]['n_test']} test)")
print(f"{'features':<34}{'linear':>8}{'k-NN':>8}")
for name in names:
    print(f"{name:<34}{table[name]['linear']:>8.3f}{table[name]['knn']:>8.3f}")
PY

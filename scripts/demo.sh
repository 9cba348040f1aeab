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

TITLE="builtin:digits test split" sh "$(dirname "$0")/probe-table.sh" "$OUT/digits-train.zarr" "$OUT/digits-test.zarr" "$OUT" "$RECIPE"

#!/bin/sh
# The quickstart (`make demo`): the main job end to end on builtin:digits, no downloads.
set -eu
OUT=${1:-demo}
mkdir -p "$OUT"
jepa ingest builtin:digits "$OUT/digits-train.zarr" --size 16x16 --split train --seed 0 --force
jepa ingest builtin:digits "$OUT/digits-test.zarr" --size 16x16 --split test --seed 0 --force
jepa info "$OUT/digits-train.zarr"

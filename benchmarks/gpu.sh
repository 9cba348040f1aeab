#!/usr/bin/env bash
# The GPU benchmark, unattended (about 8-9 minutes on one H200, from its parts timed there):
#   I-JEPA ViT-B/16 and ViT-L/16 at 224 px (predictor 12 x 384, in1k_vith14's masks), each in bfloat16
#   at the largest batch that fits and in float32 at that batch, then the official PyTorch step
#   (facebookresearch/ijepa at 52c1ae95) at the same size and batch where torch with CUDA and a
#   checkout are at hand. Images/s and model FLOP utilisation against the chip's peak
#   (benchmarks/gpu_step.py PEAK_TFLOPS, by device name).
#
#   bash benchmarks/gpu.sh [TABLE.md]                 # default table file: gpu-bench.md
#   REFERENCE=~/src/ijepa bash benchmarks/gpu.sh      # also the official step (torch must see CUDA)
#   TINY=1 bash benchmarks/gpu.sh t.md                # a 1-block, 32-wide ViT at 32 px, 2 steps: a CPU smoke test
#   LEVERS="--attention-impl dot_product; --remat dots" bash benchmarks/gpu.sh   # the speed levers to measure
#
# Each configuration runs in its own process (an out-of-memory or failing row does not stop the
# others; its error goes into the table, its whole output into TABLE.log). After the table, a profile
# of each model's bf16 step per op class (benchmarks/op_profile.py; PROFILE=0 leaves it out, TINY=1 too
# unless PROFILE=1), and the input pipeline at 224 px with every core (benchmarks/pipeline.py: normalised
# on the host and on the device). The official step halves its
# batch on out-of-memory (at most twice); the table gives the batch it ran at. After each model's bf16
# row, one row per lever at that row's batch: LEVERS holds ';'-separated sets of gpu_step.py options
# (default "--attention-impl dot_product", cuDNN's flash attention; TINY: none), and each set also gets
# a profile, so it takes only options that benchmarks/op_profile.py takes too. Environment: PYTHON
# (default .venv/bin/python), STEPS (default 10), MODELS (default "base large"), F32 (0: no float32 rows).
set -uo pipefail
cd "$(dirname "$0")/.."
TABLE=${1:-gpu-bench.md}
PYTHON=${PYTHON:-.venv/bin/python}
LOG=$TABLE.log  # every row's whole output (the table keeps only an error's last line)
ROWS=$(mktemp)
: > "$LOG"
trap 'rm -f "$ROWS"' EXIT

if [[ -n "${TINY:-}" ]]; then
  LEVERS=${LEVERS:-}
  MODELS=${MODELS:-tiny}; SIZE=32; PATCH=8
  PRED=(--depth 1 --width 32 --heads 2 --pred-depth 1 --pred-width 32 --min-keep 2)
  STEPS=${STEPS:-2}; BATCH=auto; PROBE=(--probe-batch 4)
else
  MODELS=${MODELS:-base large}; SIZE=224; PATCH=16; PRED=(--pred-depth 12 --pred-width 384 --min-keep 10)
  STEPS=${STEPS:-10}; BATCH=auto; PROBE=(--probe-batch 16)
fi
LEVERS=${LEVERS---attention-impl dot_product}
IFS=';' read -ra LEVER_SETS <<< "$LEVERS"

error_row() {  # error_row LABEL OUTPUT: a failed row (the last 300 characters of its output) into $ROWS
  "$PYTHON" -c 'import json,sys; print(json.dumps({"label": sys.argv[1], "error": sys.argv[2][-300:]}))' "$1" "$2" >> "$ROWS"
}

flush() {  # the table so far, so that a run stopped part-way keeps the rows it finished
  "$PYTHON" benchmarks/gpu_table.py "$ROWS" > "$TABLE.tmp" && mv "$TABLE.tmp" "$TABLE"
}

row() {  # row LABEL ARGS...: one JSON line into $ROWS, or an error line
  local label=$1; shift
  local out
  if out=$("$PYTHON" benchmarks/gpu_step.py --json "$@" 2>&1 | tee -a "$LOG" | tail -n 1) && [[ $out == \{* ]]; then
    echo "$out" >> "$ROWS"
  else
    error_row "$label" "$out"
  fi
  flush
}

for model in $MODELS; do
  common=(--model "$model" --patch-size "$PATCH" --image-size "$SIZE" "${PRED[@]}" --steps "$STEPS")
  row "$model bf16" "${common[@]}" --dtype bfloat16 --batch "$BATCH" "${PROBE[@]}"
  batch=$("$PYTHON" -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])][-1]; print(r.get("batch", ""))' "$ROWS")
  [[ -n "$batch" ]] || batch=16
  for lever in "${LEVER_SETS[@]}"; do
    read -ra lever_args <<< "$lever"
    (( ${#lever_args[@]} )) || continue
    row "$model bf16 ${lever_args[*]}" "${common[@]}" --dtype bfloat16 --batch "$batch" "${lever_args[@]}"
  done
  [[ "${F32:-1}" == 0 ]] || row "$model f32" "${common[@]}" --dtype float32 --batch "$batch"
  if [[ -n "${REFERENCE:-}" ]]; then
    name=vit_$model
    official_batch=$batch
    for _ in 1 2 3; do  # the official step keeps more activations than ours: halve the batch on out-of-memory
      out=$("$PYTHON" benchmarks/official_ijepa_step.py --reference "$REFERENCE" --device cuda --bf16 \
            --model "$name" --crop-size "$SIZE" --patch-size "$PATCH" --pred-depth 12 --pred-emb-dim 384 \
            --min-keep 10 --batch "$official_batch" --steps "$STEPS" 2>&1 | tee -a "$LOG" | tail -n 1)
      [[ $out != \{* && $out == *"out of memory"* ]] || break
      official_batch=$((official_batch / 2))
    done
    if [[ $out == \{* ]]; then
      echo "$out" | "$PYTHON" -c 'import json,sys; r=json.load(sys.stdin); r["official"]=True; r["batch"]=int(sys.argv[1]); print(json.dumps(r))' "$official_batch" >> "$ROWS"
    else
      error_row "official $model bf16" "$out"
    fi
    flush
  fi
done
flush
if [[ -n "${TINY:-}" ]]; then PROFILE=${PROFILE:-0}; fi  # the smoke test keeps to the rows
if [[ "${PROFILE:-1}" != 0 ]]; then  # where each model's bf16 step spends its time, per op class, after the table
  for model in $MODELS; do
    batch=$("$PYTHON" -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if "\"official\"" not in l]; print(next((x.get("batch", "") for x in r if x.get("model") == sys.argv[2] and x.get("dtype") == "bfloat16"), ""))' "$ROWS" "$model")
    for lever in "" "${LEVER_SETS[@]}"; do
      read -ra lever_args <<< "$lever"
      [[ -z "$lever" ]] || (( ${#lever_args[@]} )) || continue
      out=$("$PYTHON" benchmarks/op_profile.py --model "$model" --patch-size "$PATCH" --image-size "$SIZE" "${PRED[@]}" \
            --dtype bfloat16 --batch "${batch:-16}" --steps 3 "${lever_args[@]}" 2>&1 | tee -a "$LOG")
      if [[ $out == *"| op class"* ]]; then
        printf '\n%s bf16 %s\n\n%s\n' "$model" "${lever_args[*]}" "$out" >> "$TABLE"
      else
        printf '\nprofile of %s bf16 %s failed: %s\n' "$model" "${lever_args[*]}" "${out: -300}" >> "$TABLE"
      fi
    done
  done
fi
if [[ -z "${TINY:-}" ]]; then  # can the host feed the step: the input pipeline at 224 px, both normalisations
  out=$("$PYTHON" benchmarks/pipeline.py --size 224 --source-size 256 --threads "$(nproc)" --batches 30 2>&1 | tee -a "$LOG")
  printf '
input pipeline, %s threads

%s
' "$(nproc)" "$out" >> "$TABLE"
fi
cat "$TABLE"

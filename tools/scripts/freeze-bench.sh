#!/bin/bash
# Step time, plan and peak resident memory of a fine-tune by --freeze (and with the frozen
# layers' biases training, --train-biases: the variants named "+biases"), in alternating rounds:
#   tools/scripts/freeze-bench.sh WEIGHTS DATA [BATCH] [ROUNDS]
# WEIGHTS: a checkpoint to fine-tune (its model and input size fit DATA's records); DATA: a
# packed dataset. Each run trains 4 epochs with the CPU engine; T_step is the mean of the
# balance lines of epochs 2-4, so it includes what the loaders take of the cores. The engine's
# step alone, against the full step with the runs alternating in one process:
#   fulcrum bench compute --model det-m --batch 16 --cpu-only --freeze backbone+neck
# A developer tool: measure on a quiet machine.
set -euo pipefail
weights=${1:?usage: freeze-bench.sh WEIGHTS DATA [BATCH] [ROUNDS]}
data=${2:?usage: freeze-bench.sh WEIGHTS DATA [BATCH] [ROUNDS]}
batch=${3:-16}
rounds=${4:-2}
fulcrum=${FULCRUM:-$(dirname "$0")/../../target/release/fulcrum}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for round in $(seq "$rounds"); do
  for variant in none early backbone backbone+neck backbone+biases backbone+neck+biases; do
    freeze=${variant%+biases}
    biases=()
    [ "$freeze" = "$variant" ] || biases=(--train-biases)
    log=$work/$variant.log
    "$fulcrum" train --data "$data" --out "$work/$variant-$round" --init-from "$weights" \
      --freeze "$freeze" "${biases[@]}" --batch "$batch" --epochs 4 --engine cpu >"$log" 2>&1 ||
      { tail -5 "$log"; exit 1; }
    step=$(grep -o "T_step = [0-9.]* ms" "$log" | tail -3 | awk '{s += $3} END {printf "%.2f", s / NR}')
    plan=$(grep -o "[0-9.]* MiB planned up front" "$log" | awk '{print $1}')
    peak=$(grep -o "peak resident [0-9.]* MiB" "$log" | awk '{print $3}')
    echo "round $round, --freeze $freeze ${biases[*]}: T_step $step ms, plan $plan MiB, peak resident $peak MiB"
  done
done

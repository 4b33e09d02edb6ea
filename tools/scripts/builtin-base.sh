#!/bin/bash
# Makes the photo recipe's built-in base, runtime/assets/det-m-base.safetensors, again: det-m
# trained on 16384 images of the built-in synthetic set (seed 7, packed at 256: 3.2 GB of
# shards) with the photo recipe for 12 epochs (12288 steps, about 22 minutes on 2 cores), from
# random weights, then exported without optimizer state. No photos and nobody's data go into it.
#   tools/scripts/builtin-base.sh [WORK]
# WORK (default runs/builtin-base) keeps the pack and the run. The CPU engine's result depends
# on the kernels the machine has, so another machine makes a base of the same kind, not
# necessarily of the same bits; docs/perf/recipes.md says how the shipped one scores.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-$root/runs/builtin-base}
fulcrum=${FULCRUM:-$root/target/release/fulcrum}
mkdir -p "$work"
"$fulcrum" pack --synthetic 16384 --seed 7 --size 256 --out "$work/data"
"$fulcrum" train --recipe photos --from-scratch --engine cpu --data "$work/data" --epochs 12 \
  --out "$work/run"
"$fulcrum" export --weights "$work/run/last.safetensors" \
  --checkpoint "$root/runtime/assets/det-m-base.safetensors"

#!/usr/bin/env bash
# The Vulkan engine on a real GPU in one short run: its tests under validation, `bench compute`
# for the three presets (det-s with the fp16 variants too, and with the GEMM tiles forced for
# an A/B of the per-shape ones), PyTorch CUDA's det-s for scale, and the demo on both engines.
# A developer tool for a borrowed GPU machine, not a test. Build here, run there:
#
#   cargo build --release -p fulcrum-tools --bin fulcrum
#   cargo test --release --no-run -p fulcrum --lib -p fulcrum-tests \
#       --test engines --test ring_memory --test no_alloc
#   # copy target/release/fulcrum and the test executables (target/release/deps/fulcrum-*,
#   # engines-*, ring_memory-*, no_alloc-*) into BIN as fulcrum, libtests, engines,
#   # ring_memory, no_alloc
#   BIN=bin OUT=results bash tools/scripts/gpu-check.sh
#
# With BASE=path/to/an/older/fulcrum, det-s is benched with it and with BIN's in alternating
# rounds first (a before/after on the same GPU in the same run).
#
# Each part has its own time limit, so one that hangs does not cost the rest. Figures go to
# $OUT (bench JSON, PyTorch JSON, demo reports) and the log to stdout.
set -u
BIN=${BIN:?BIN: the folder with fulcrum and the test executables}
OUT=${OUT:?OUT: the folder for the results}
mkdir -p "$OUT"
section() { printf '\n=== %s (%s)\n' "$1" "$(date +%T)"; }

section "device"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>/dev/null
"$BIN/fulcrum" devices

if [ -n "${BASE:-}" ]; then
    section "bench compute det-s, BASE then BIN, twice"
    for round in 1 2; do
        for bin in "$BASE" "$BIN/fulcrum"; do
            echo "--- $bin (round $round)"
            timeout 60 "$bin" bench compute --runs 30 --top 12 | tail -22
        done
    done
fi

section "bench compute det-s (with the fp16 variants too)"
timeout 120 "$BIN/fulcrum" bench compute --runs 30 --top 12 --fp16 --json "$OUT/bench-s.json"

section "det-s, per-shape GEMM tiles against every tile 32x64 and 64x128, twice"
for round in 1 2; do
    for tile in own 32x64 64x128; do
        echo "--- tile $tile (round $round)"
        if [ "$tile" = own ]; then
            timeout 60 "$BIN/fulcrum" bench compute --runs 30 --top 12 | grep -E 'step|forward|pointwise|conv2d_grad'
        else
            FULCRUM_VULKAN_GEMM_TILE=$tile timeout 60 "$BIN/fulcrum" bench compute --runs 30 --top 12 \
                | grep -E 'step|forward|pointwise|conv2d_grad'
        fi
    done
done

section "tests (Vulkan, validation on)"
export FULCRUM_REQUIRE_VULKAN=1
timeout 150 "$BIN/libtests" vulkan -q 2>&1 | tail -15
for t in engines ring_memory no_alloc; do
    timeout 90 "$BIN/$t" -q 2>&1 | tail -4
done

section "PyTorch CUDA det-s"
timeout 90 python3 tools/scripts/torch-cuda-det-s.py --batch 32 --runs 50 --graph \
    --json "$OUT/torch.json"

section "bench compute det-m, det-l"
timeout 90 "$BIN/fulcrum" bench compute --model det-m --runs 10 --json "$OUT/bench-m.json" | tail -30
timeout 90 "$BIN/fulcrum" bench compute --model det-l --runs 5 --json "$OUT/bench-l.json" | tail -30

section "demo, Vulkan then CPU"
for engine in vulkan cpu; do
    SECONDS=0
    timeout 120 "$BIN/fulcrum" demo --engine "$engine" --dir "/tmp/demo-$engine" 2>&1 | tail -6
    echo "demo --engine $engine: ${SECONDS} s"
    cp "/tmp/demo-$engine/report.md" "$OUT/demo-$engine.md" 2>/dev/null
done
section "done"

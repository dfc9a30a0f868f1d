#!/usr/bin/env bash
# Write-path timing on the device machine: the append of one decode step (one
# new token per sequence: the leaving window row demoted, the new row rotated
# and stored) with nearest rounding and with error-feedback weights, batch
# 1..256 at 4K context, for each build given (A/B runs interleaved over two
# rounds so drift hits all alike). Writes $OUT/write_path.md (medians, us).
#   bash perf/gpu/write_path.sh NAME=BUILD ... [-- SHAPE ...]
# BUILD: a folder with bench_attention and lib/liboscar_backend_cuda.so.
# SHAPE: HQ/HKV/D[/G] (default 32/8/128, the Qwen3-8B layer).
set -uo pipefail
cd "$(dirname "$0")/../.."
. perf/gpu/ab_rounds.sh
ab_args "$@"
export OSCAR_BENCH_FB=1 OSCAR_BENCH_METHODS=oscar2 OSCAR_BENCH_PREFILL=${OSCAR_BENCH_PREFILL:-0}
export OSCAR_BENCH_CASES=${OSCAR_BENCH_CASES:-1x4096,8x4096,32x4096,64x4096,128x4096,256x4096}
ab_rounds wp prefill
python3 perf/gpu/ab_table.py write "$OUT/write_path.md" wp "${builds[@]}"

#!/usr/bin/env bash
# Decode A/B timing on the device machine: the 2-bit decode of each build
# given, interleaved over two rounds so clock drift hits all alike; writes
# $OUT/decode_ab.md (median us per build and the ratio to the first build).
#   bash perf/gpu/decode_ab.sh NAME=BUILD ... [-- SHAPE ...]
# BUILD: a folder with bench_attention and lib/liboscar_backend_cuda.so.
# SHAPE: HQ/HKV/D[/G] (default 32/8/128); cases: OSCAR_BENCH_CASES (BxL,...).
set -uo pipefail
cd "$(dirname "$0")/../.."
. perf/gpu/ab_rounds.sh
ab_args "$@"
export OSCAR_BENCH_METHODS=${OSCAR_BENCH_METHODS:-oscar2}
export OSCAR_BENCH_CASES=${OSCAR_BENCH_CASES:-1x131072,8x32768,32x32768}
ab_rounds ab
python3 perf/gpu/ab_table.py decode "$OUT/decode_ab.md" ab "${builds[@]}"

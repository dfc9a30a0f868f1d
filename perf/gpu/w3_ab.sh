#!/usr/bin/env bash
# Cost of a layer holding 3-bit head-tensors (FORMAT.md §2.7) on the device machine: for each n in
# $W3_COUNTS (default "1 3": the first n head-tensors in (KV head, K before V) order are 3-bit),
# decode_ab.sh with OSCAR_BENCH_WIDE=n over every build given, then w3_table.py: each build's W3
# layer time and its ratio to the same build's 2-bit layer. Writes $OUT/w3-N.md.
#   bash perf/gpu/w3_ab.sh NAME=BUILD ... [-- SHAPE ...]
# BUILD: a folder with bench_attention and lib/liboscar_backend_cuda.so (optionally @VAR=VALUE,...).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/oscar-out}
mkdir -p "$OUT"
names=()
for a in "$@"; do [ "$a" = "--" ] && break; names+=("${a%%=*}"); done
export OSCAR_BENCH_CASES=${OSCAR_BENCH_CASES:-1x4096,1x32768,1x131072,8x32768,8x131072,32x32768,64x32768}
for n in ${W3_COUNTS:-1 3}; do
  OSCAR_BENCH_WIDE=$n bash perf/gpu/decode_ab.sh "$@" > "/tmp/w3ab-$n.log" 2>&1 || { tail -20 "/tmp/w3ab-$n.log"; exit 1; }
  python3 perf/gpu/w3_table.py ab "${names[@]}" > "$OUT/w3-$n.md"
  echo "== $n 3-bit head-tensor(s)"; tail -"$(( ${#names[@]} ))" "$OUT/w3-$n.md"
done

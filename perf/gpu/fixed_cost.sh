#!/usr/bin/env bash
# Fixed costs of a decode call (device machine): event-timed oscar2 decode of a
# build made with perf/gpu/fixed_cost_diag.patch applied, under each OSCAR_DIAG
# setting; differences between rows give the rotation, merge, prologue, epilogue
# and tile-loop shares (perf/RESULTS-attention.md, tenth session).
#   OSCAR_BENCH_BUILD=DIR bash perf/gpu/fixed_cost.sh [SHAPE ...]
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${OSCAR_BENCH_BUILD:?a build folder with bench_attention and lib/ made with the diag patch}
export OSCAR_BENCH_METHODS=oscar2
shapes=("$@")
[ ${#shapes[@]} = 0 ] && shapes=(32/8/128 64/4/128)
echo "| shape | OSCAR_DIAG | what runs | B1 x 4K us | B8 x 32K us | B32 x 32K us | B1 x 128K us |"
echo "|---|---|---|---|---|---|---|"
for S in "${shapes[@]}"; do
  for D in 0 1 2 3 7 19 11; do
    case $D in
      0) what="everything";; 1) what="no rotation";; 2) what="no merge";; 3) what="attention kernel only";;
      7) what="attention prologue + epilogue";; 19) what="attention prologue";; 11) what="attention launch";;
    esac
    OSCAR_DIAG=$D OSCAR_BENCH_CASES=1x4096,8x32768,32x32768,1x131072 timeout 300 \
      "$B/bench_attention" "$B/lib/liboscar_backend_cuda.so" /tmp/fixed_cost.tsv "$S" > /dev/null 2>&1
    awk -F'\t' -v s="$S" -v d="$D" -v w="$what" 'NR>1 && $1 !~ /^#/ {t[$3"x"$4]=$6}
      END {printf "| %s | %s | %s | %s | %s | %s | %s |\n", s, d, w, t["1x4096"], t["8x32768"], t["32x32768"], t["1x131072"]}' /tmp/fixed_cost.tsv
  done
done

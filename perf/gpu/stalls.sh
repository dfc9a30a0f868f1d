#!/usr/bin/env bash
# Warp stall breakdown of the 2-bit decode kernel at one benchmark point
# (device machine; run perf/gpu/profile.sh first or let this build).
#   bash perf/gpu/stalls.sh [BxL]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/oscar-out}
mkdir -p "$OUT"
CASE=${1:-32x32768}
B=/tmp/oscar-bench-min
[ -x $B/bench_attention ] || { cmake -S perf/gpu -B $B -G Ninja -DOSCAR_GEN_SET=minimal -DCMAKE_BUILD_TYPE=Release > "$OUT/build.log" 2>&1 && cmake --build $B -j16 >> "$OUT/build.log" 2>&1; } || exit 1
cmake --build $B -j16 >> "$OUT/build.log" 2>&1
m=smsp__average_warps_issue_stalled
metrics=""
for r in long_scoreboard short_scoreboard wait math_pipe_throttle mio_throttle lg_throttle barrier membar not_selected selected dispatch_stall no_instruction branch_resolving drain sleeping tex_throttle imc_miss misc; do
  metrics="$metrics,${m}_${r}_per_issue_active.ratio"
done
metrics="${metrics#,},sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,launch__grid_size"
OSCAR_BENCH_CASES=$CASE OSCAR_BENCH_METHODS=oscar2 timeout 300 ncu --clock-control none --kernel-name regex:oscar_decode \
  --launch-skip 3 --launch-count 1 --metrics "$metrics" $B/bench_attention $B/lib/liboscar_backend_cuda.so "$OUT/st.tsv" > "$OUT/stalls.txt" 2>&1
grep -E "ratio|pct|sum|grid" "$OUT/stalls.txt" | sed 's/smsp__average_warps_issue_stalled_//' | awk '{print $1, $NF}' | sort -k2 -rn

#!/usr/bin/env bash
# Nsight Compute profile of the decode kernel at one benchmark point (device
# machine): speed of light, occupancy, scheduler and warp-state sections, the
# warp stall reasons per issued instruction, and the SASS instruction mix of
# the kernel the plan chose. Uses a prebuilt OSCAR_BENCH_BUILD like run.sh.
#   bash perf/gpu/profile.sh [BxL] [HQ/HKV/D[/G]] [oscar2|bf16]   (default 32x32768 32/8/128 oscar2)
# PROF_KERNEL=oscar_extend_tc with OSCAR_BENCH_EXTEND=n profiles the tensor-core
# extend of n query tokens per sequence instead (bench_attention runs it after the decode).
# PROF_SOURCE=1 also samples stalls per SASS instruction (SourceCounters; PROF_SAMPLING=N passes
# ncu --warp-sampling-interval N, 2^(5+N) cycles: 0 gave 8023 samples of a 12 us append) and prints
# perf/gpu/sass_mix.py's summary of them ($OUT/source-TAG.csv keeps the whole page).
set -uo pipefail
cd "$(dirname "$0")/../.."
# Full reports go to PROF_OUT (default /tmp: the device machine returns few files).
OUT=${PROF_OUT:-/tmp/oscar-prof}
mkdir -p "$OUT"
CASE=${1:-32x32768}
SHAPE=${2:-32/8/128}
METHOD=${3:-oscar2}
B=${OSCAR_BENCH_BUILD:-/tmp/oscar-bench}
if [ ! -x "$B/bench_attention" ]; then
  cmake -S perf/gpu -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release > "$OUT/build.log" 2>&1 &&
    cmake --build $B -j16 >> "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; }
fi
so=$B/lib/liboscar_backend_cuda.so
tag=$(echo "$SHAPE-$CASE-$METHOD${OSCAR_BENCH_EXTEND:+-n$OSCAR_BENCH_EXTEND}" | tr '/,' '__')
m=smsp__average_warps_issue_stalled
metrics=""
for r in long_scoreboard short_scoreboard wait math_pipe_throttle mio_throttle lg_throttle barrier membar not_selected \
         selected dispatch_stall no_instruction branch_resolving drain sleeping tex_throttle imc_miss misc; do
  metrics="$metrics,${m}_${r}_per_issue_active.ratio"
done
metrics="${metrics#,},smsp__inst_executed.sum,launch__grid_size,launch__registers_per_thread,smsp__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
OSCAR_BENCH_CASES=$CASE OSCAR_BENCH_METHODS=$METHOD timeout 300 ncu --clock-control none \
  --kernel-name regex:${PROF_KERNEL:-oscar_decode} --launch-skip 3 --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats \
  --metrics "$metrics" $B/bench_attention $so "$OUT/prof.tsv" "$SHAPE" > "$OUT/ncu-$tag.txt" 2>&1
echo "ncu rc=$? ($tag)"
kern=$(grep -oE "${PROF_KERNEL:-oscar_decode}_[a-z0-9_]+" "$OUT/ncu-$tag.txt" | head -1)
grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Registers Per|Achieved Occupancy|Theoretical Occ|Issued Ipc|No Eligible|Eligible Warps|Active Warps Per|hmma|inst_executed|grid_size" \
  "$OUT/ncu-$tag.txt" | sed 's/  */ /g' | head -24
grep -E "issue_stalled" "$OUT/ncu-$tag.txt" | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' |
  awk '{print $1, $NF}' | sort -k2 -rn | head -8 | tr '\n' ';'
echo
if [ -n "$kern" ]; then
  cuobjdump --dump-sass --function "$kern" $so > "$OUT/sass-$tag.txt" 2>&1
  echo "SASS of $kern: $(grep -c '/\*[0-9a-f]*\*/' "$OUT/sass-$tag.txt") lines; mix:"
  awk '/\/\*[0-9a-f]+\*\//{for(i=1;i<=NF;i++) if($i ~ /^[A-Z][A-Z0-9_.]+$/ && $i != "PT"){split($i,a,"."); print a[1]; break}}' \
    "$OUT/sass-$tag.txt" | sort | uniq -c | sort -rn | head -16 | tr '\n' ' '
  echo
fi
if [ -n "${PROF_SOURCE:-}" ]; then
  OSCAR_BENCH_CASES=$CASE OSCAR_BENCH_METHODS=$METHOD timeout 300 ncu --clock-control none \
    --kernel-name regex:${PROF_KERNEL:-oscar_decode} --launch-skip 3 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --import-source no ${PROF_SAMPLING:+--warp-sampling-interval $PROF_SAMPLING} -f -o "$OUT/src-$tag" \
    $B/bench_attention $so "$OUT/prof.tsv" "$SHAPE" > "$OUT/ncu-src-$tag.txt" 2>&1
  echo "ncu source counters rc=$?"
  ncu -i "$OUT/src-$tag.ncu-rep" --page source --csv --print-source sass > "$OUT/source-$tag.csv" 2>> "$OUT/ncu-src-$tag.txt" &&
    python3 perf/gpu/sass_mix.py "$OUT/source-$tag.csv" 0 12
fi

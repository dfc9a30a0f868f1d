#!/usr/bin/env bash
# Nsight Compute profile of the 2-bit decode kernel at one benchmark point
# (device machine). Prints speed-of-light, occupancy, warp stall and scheduler
# sections and the SASS instruction mix of the decode kernel.
#   bash perf/gpu/profile.sh [BxL]      (default 32x32768)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/oscar-out}
mkdir -p "$OUT"
CASE=${1:-32x32768}
B=/tmp/oscar-bench-min
cmake -S perf/gpu -B $B -G Ninja -DOSCAR_GEN_SET=minimal -DCMAKE_BUILD_TYPE=Release > "$OUT/build.log" 2>&1 &&
  cmake --build $B -j16 >> "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; }
so=$B/lib/liboscar_backend_cuda.so
cuobjdump --dump-sass --function oscar_decode_d128_g128_q4_bf16_mf16_u $so > "$OUT/decode.sass" 2>&1
echo "SASS lines: $(grep -c '/\*[0-9a-f]*\*/' "$OUT/decode.sass")"
awk '/\/\*[0-9a-f]+\*\//{for(i=1;i<=NF;i++) if($i ~ /^[A-Z][A-Z0-9_.]+$/ && $i != "PT"){split($i,a,"."); print a[1]; break}}' \
  "$OUT/decode.sass" | sort | uniq -c | sort -rn | head -25
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ -z "$NCU" ]; then echo "no ncu"; exit 0; fi
OSCAR_BENCH_CASES=$CASE OSCAR_BENCH_METHODS=oscar2 timeout 400 "$NCU" --clock-control none \
  --kernel-name regex:oscar_decode --launch-skip 3 --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
  --section LaunchStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  $B/bench_attention $so "$OUT/prof.tsv" > "$OUT/ncu.txt" 2>&1
echo "ncu rc=$?"
grep -vE "^\s*$|----|^==PROF==|^oscar2 |^device|^copy" "$OUT/ncu.txt" | cut -c1-150 | head -150

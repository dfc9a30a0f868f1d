#!/usr/bin/env bash
# GPU check + benchmark in one go (device machine; see perf/RESULTS-attention.md).
# Builds the CUDA plugin and the benchmark with CMake + ninja (perf/gpu is a
# standalone project: CUDA, Python 3 + jinja2 only), runs the conformance test
# against the CPU reference on CUDA (binary + Criterion libs carried in
# build-carry-conf/, built on the dev machine: the GPU image has no Criterion), then
# times 2-bit decode, the library's BF16 paged decode, the write path and
# torch SDPA. Prints the Markdown table last and writes everything under $OUT.
#   bash perf/gpu/run.sh [quick]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/oscar-out}
mkdir -p "$OUT"
QUICK=${1:-}
SET=${OSCAR_GEN_SET:-default}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv | tee "$OUT/gpu.txt"
B=/tmp/oscar-bench
t0=$(date +%s)
cmake -S perf/gpu -B $B -G Ninja -DOSCAR_GEN_SET=$SET -DCMAKE_BUILD_TYPE=Release > "$OUT/build.log" 2>&1 &&
  cmake --build $B -j16 >> "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
grep -E "registers|spill" "$OUT/build.log" | head -5
if [ -x build-carry-conf/test_backend_conformance ]; then
  t0=$(date +%s)
  LD_LIBRARY_PATH=$PWD/build-carry-conf/lib OSCAR_PLUGIN_PATH=$B/lib OSCAR_REQUIRE_BACKENDS=cuda \
    timeout 300 build-carry-conf/test_backend_conformance --jobs 8 --verbose > "$OUT/conformance.log" 2>&1
  echo "conformance rc=$? ($(( $(date +%s) - t0 )) s)"
  grep -E "Assertion|seed|Synthesis|FAIL|CRASH|skipped" "$OUT/conformance.log" | sort | uniq -c | head -20
fi
t0=$(date +%s)
timeout 400 $B/bench_attention $B/lib/liboscar_backend_cuda.so "$OUT/oscar.tsv" $QUICK 2>&1 | tee "$OUT/bench.log" | tail -40
echo "bench: $(( $(date +%s) - t0 )) s"
# OSCAR_SKIP_SDPA=1: no torch SDPA yardstick (write-path runs).
[ -n "${OSCAR_SKIP_SDPA:-}" ] && exit 0
t0=$(date +%s)
PYTHONUNBUFFERED=1 timeout 300 python3 perf/gpu/sdpa_bench.py "$OUT/sdpa.tsv" $QUICK 2>&1 | tee "$OUT/sdpa.log" | tail -15
echo "sdpa: $(( $(date +%s) - t0 )) s"
python3 perf/gpu/report.py "$OUT/oscar.tsv" "$OUT/sdpa.tsv" | tee "$OUT/table.md"

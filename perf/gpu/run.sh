#!/usr/bin/env bash
# GPU check + benchmark in one go (device machine; see perf/RESULTS-attention.md).
# Builds the CUDA plugin and the benchmark with CMake + ninja (perf/gpu is a
# standalone project: CUDA, Python 3 + jinja2 only), runs the conformance test
# against the CPU reference on CUDA (binary + Criterion libs carried in
# build-carry-conf/, built on the dev machine: the GPU image has no Criterion), then
# times 2-bit decode, the library's BF16 paged decode, the write path and
# torch SDPA. Prints the Markdown table last and writes everything under $OUT.
# Shapes: the model zoo below (HQ/HKV/D[/G]), or OSCAR_BENCH_SHAPES="...".
# A prebuilt build folder (bench_attention + lib/liboscar_backend_cuda.so, e.g.
# carried from the dev machine, whose nvcc is the same) is used as it is when
# OSCAR_BENCH_BUILD names it.
#   bash perf/gpu/run.sh [quick]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/oscar-out}
mkdir -p "$OUT"
QUICK=${1:-}
SET=${OSCAR_GEN_SET:-default}
# At most 8 files come back from the device machine: gpu.txt, conformance.log,
# bench.log, oscar.tsv, sdpa.tsv, table.md, roofline.png (logs of the rest in /tmp).
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv | tee "$OUT/gpu.txt"
# The model zoo: Qwen3-8B / Llama-3-8B (g128 and g32), Qwen3-32B / Llama-3-70B,
# GLM-4.5/4.7, Qwen3-235B, Qwen2.5-7B, Llama-3.2-3B, MHA (Llama-2-7B),
# Gemma-2 (d 256), Llama-3.2-1B (d 64), small d-64 GQA-4 models.
ZOO="32/8/128 32/8/128/32 64/8/128 96/8/128 64/4/128 28/4/128 24/8/128 32/32/128 16/8/256 32/8/64 16/4/64"
SHAPES=${OSCAR_BENCH_SHAPES:-$ZOO}
B=${OSCAR_BENCH_BUILD:-/tmp/oscar-bench}
if [ -x "$B/bench_attention" ] && [ -f "$B/lib/liboscar_backend_cuda.so" ]; then
  echo "using the prebuilt $B"
else
  t0=$(date +%s)
  cmake -S perf/gpu -B $B -G Ninja -DOSCAR_GEN_SET=$SET -DCMAKE_BUILD_TYPE=Release > /tmp/oscar-build.log 2>&1 &&
    cmake --build $B -j16 >> /tmp/oscar-build.log 2>&1 || { tail -40 /tmp/oscar-build.log; echo "BUILD FAILED"; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
fi
if [ -x build-carry-conf/test_backend_conformance ]; then
  for t in test_backend_conformance test_bad_input test_bad_input_alias test_plan_threads test_cuda_graph test_workspace; do
    [ -x build-carry-conf/$t ] || continue
    t0=$(date +%s)
    LD_LIBRARY_PATH=$PWD/build-carry-conf/lib OSCAR_PLUGIN_PATH=$B/lib OSCAR_REQUIRE_BACKENDS=cuda \
      timeout 300 build-carry-conf/$t --jobs 8 --verbose >> "$OUT/conformance.log" 2>&1
    echo "$t rc=$? ($(( $(date +%s) - t0 )) s)"
  done
  grep -E "Assertion|seed|Synthesis|FAIL|CRASH" "$OUT/conformance.log" | sort | uniq -c | head -20
fi
t0=$(date +%s)
# shellcheck disable=SC2086
timeout 420 $B/bench_attention $B/lib/liboscar_backend_cuda.so "$OUT/oscar.tsv" $QUICK $SHAPES 2>&1 |
  tee "$OUT/bench.log" | tail -4
echo "bench: $(( $(date +%s) - t0 )) s"
# OSCAR_SKIP_SDPA=1: no torch SDPA yardstick (write-path runs).
[ -n "${OSCAR_SKIP_SDPA:-}" ] && exit 0
t0=$(date +%s)
# shellcheck disable=SC2086
PYTHONUNBUFFERED=1 timeout 300 python3 perf/gpu/sdpa_bench.py "$OUT/sdpa.tsv" $QUICK $SHAPES > /tmp/oscar-sdpa.log 2>&1
echo "sdpa: rc $? $(( $(date +%s) - t0 )) s"
python3 perf/gpu/report.py "$OUT/oscar.tsv" "$OUT/sdpa.tsv" > "$OUT/table.md"
python3 perf/gpu/plot.py "$OUT/oscar.tsv" "$OUT/sdpa.tsv" "$OUT/roofline.png" || echo "plot failed"
sed -n '/^| shape | 2-bit variant/,$p' "$OUT/table.md"

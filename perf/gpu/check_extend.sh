#!/usr/bin/env bash
# GPU checks of the extend paths, the 3-bit head-tensors and per-layer pages (device machine), in one
# call: builds the CUDA plugin with the d 64 and d 128 variants of perf/gpu/set-extend.json (~2.5
# minutes on the H100's 16 cores), runs the carried conformance binaries' extend, wide and tensor-core
# cases, test_bad_input, test_per_layer_pages, test_cuda_graph, test_workspace, test_plan_threads, then
# perf/gpu/extend_ab.sh (the long-chunk kernel on and off, SDPA beside). CUDA_ARCHS=90a builds the
# sm_90a kernels (the wgmma long-chunk path where the tree has it); NO_TESTS=1 builds only.
#   here:   bash perf/gpu/carry_conf.sh && tar -cJf .devcarry/conf.tar.xz build-carry-conf
#   there:  run(command="bash perf/gpu/check_extend.sh", carry=[".devcarry/conf.tar.xz"])
set -u
cd "$(dirname "$0")/../.."
[ -d build-carry-conf ] || tar -xJf .devcarry/conf.tar.xz
B=${OSCAR_BENCH_BUILD:-/tmp/oscar-extend}
if [ ! -x "$B/bench_attention" ]; then
  { cmake -S perf/gpu -B "$B" -G Ninja -DOSCAR_GEN_SET="$PWD/perf/gpu/set-extend.json" -DCMAKE_BUILD_TYPE=Release \
      -DOSCAR_CUDA_ARCHS="${CUDA_ARCHS:-90}" -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90}" &&
    ninja -C "$B"; } > /tmp/check-extend-build.log 2>&1 || { tail -30 /tmp/check-extend-build.log; exit 1; }
fi
[ -n "${NO_TESTS:-}" ] || (
  export LD_LIBRARY_PATH=$PWD/build-carry-conf/lib OSCAR_PLUGIN_PATH=$B/lib OSCAR_REQUIRE_BACKENDS=cuda OSCAR_TEST_WORST=1
  for f in 'extend/*' 'wide/*' 'conformance/d128_gqa4_tensor_core_shapes' 'conformance/error_feedback_rounding' \
           'conformance/large_ragged_batch'; do
    timeout 300 build-carry-conf/test_backend_conformance --jobs 14 --filter "$f" > /tmp/c.txt 2>&1
    echo "$f rc=$? $(grep Synthesis /tmp/c.txt)"
    grep -E "FAIL|\[----\]" /tmp/c.txt | head -4 | cut -c1-400
    grep "worst error" /tmp/c.txt | sort -t' ' -k7 -rn | head -3
  done
  for t in test_bad_input test_bad_input_alias test_per_layer_pages test_cuda_graph test_workspace test_plan_threads; do
    timeout 200 build-carry-conf/$t --jobs 8 > /tmp/t.txt 2>&1
    echo "$t rc=$? $(grep Synthesis /tmp/t.txt)"
    grep -E "FAIL|\[----\]" /tmp/t.txt | head -4 | cut -c1-400
  done
)
[ -n "${NO_AB:-}" ] || NS=${NS:-4,8,64,256,512} OSCAR_BENCH_BUILD=$B timeout 300 bash perf/gpu/extend_ab.sh 2>&1 | tail -14
# NCU=1: the long-chunk call's kernels at batch 1 x 32K, n 512 (durations under ncu, clocks left alone)
if [ -n "${NCU:-}" ] && command -v ncu > /dev/null; then
  OSCAR_BENCH_CASES=1x32768 OSCAR_BENCH_METHODS=oscar2 OSCAR_BENCH_EXTEND=512 timeout 120 ncu --clock-control none \
    --kernel-name regex:'oscar_(rotate_rows|extend_fa|merge_rows)' --launch-skip 6 --launch-count 3 \
    --section SpeedOfLight --metrics smsp__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
    "$B/bench_attention" "$B/lib/liboscar_backend_cuda.so" /tmp/ncu.tsv 32/8/128 > /tmp/ncu.txt 2>&1
  grep -E "^  oscar_|Duration|hmma" /tmp/ncu.txt | sed 's/  */ /g' | cut -c1-120
fi
nvidia-smi --query-gpu=name --format=csv,noheader

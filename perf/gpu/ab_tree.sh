#!/usr/bin/env bash
# Extend A/B of this tree against another tree's plugin, with this tree's GPU checks first (device
# machine, one call). The other tree travels as an archive of the folders the plugin build reads:
#   here:   git archive REV backends templates gen include runtime format perf/gpu calib cmake \
#             CMakeLists.txt | xz > .devcarry/base.tar.xz
#           bash perf/gpu/carry_conf.sh && tar -cJf .devcarry/conf.tar.xz build-carry-conf
#   there:  run(command="bash perf/gpu/ab_tree.sh",
#               carry=[".devcarry/conf.tar.xz", ".devcarry/base.tar.xz"])
# Env: NS (default 64,512), BASE_SET (the archived tree's kernel set, default minimal; e.g.
# $PWD/perf/gpu/set-extend.json for d 64), NO_CHECK=1 (A/B only), NCU=1 (this tree's long-chunk kernels under ncu),
# CUDA_ARCHS / BASE_ARCHS (default 90; 90a: the sm_90a kernels, e.g. the wgmma long-chunk path),
# PROBE=1 (perf/gpu/wgmma_probe.cu first: which wgmma descriptor reading is right).
# "off" columns: the archived tree's plugin with its defaults; "on": this tree's.
set -u
cd "$(dirname "$0")/../.."
if [ -n "${PROBE:-}" ]; then
  nvcc -gencode arch=compute_90a,code=sm_90a -O2 -o /tmp/wgmma_probe perf/gpu/wgmma_probe.cu 2>&1 | grep -v C7519
  /tmp/wgmma_probe
fi
mkdir -p /tmp/base && tar -xJf .devcarry/base.tar.xz -C /tmp/base
( cmake -S /tmp/base/perf/gpu -B /tmp/bb -G Ninja -DCMAKE_BUILD_TYPE=Release -DOSCAR_GEN_SET="${BASE_SET:-minimal}" \
    -DOSCAR_CUDA_ARCHS="${BASE_ARCHS:-90}" -DCMAKE_CUDA_ARCHITECTURES="${BASE_ARCHS:-90}" > /tmp/bb.log 2>&1 &&
  ninja -C /tmp/bb >> /tmp/bb.log 2>&1; echo "archived tree's plugin: build rc=$?" ) &
NO_AB=1 NO_TESTS=${NO_CHECK:-} OSCAR_BENCH_BUILD=/tmp/oscar-extend bash perf/gpu/check_extend.sh 2>&1 | grep -v "^NVIDIA"
[ -x /tmp/oscar-extend/bench_attention ] || exit 1
wait
BASE_SO=/tmp/bb/lib/liboscar_backend_cuda.so NS=${NS:-64,512} OSCAR_BENCH_BUILD=/tmp/oscar-extend timeout 300 \
  bash perf/gpu/extend_ab.sh 2>&1 | tail -7
nvidia-smi --query-gpu=name --format=csv,noheader

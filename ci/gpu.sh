#!/usr/bin/env bash
# CI on a runner with an NVIDIA or AMD GPU (.ci/run is the CPU one): builds liboscar for the GPU
# found (its compute capability or gfx ISA, so the plugin's probe accepts it), then runs the suites
# that compare that backend with the CPU reference, requiring it (OSCAR_REQUIRE_BACKENDS): a
# backend that does not load or run fails them instead of being skipped.
#   bash ci/gpu.sh [cuda|hip]      default: the vendor whose GPU is found
# Needs what .ci/run needs (ci/install-deps.sh) plus the vendor's toolkit (nvcc, or hipcc and
# libamdhip64); OSCAR_GPU_CI_BUILD names the build folder (default build-gpu).
set -euo pipefail
cd "$(dirname "$0")/.."
want=${1:-}
if [ -z "$want" ]; then
  if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
    want=cuda
  elif command -v rocminfo > /dev/null && rocminfo > /dev/null 2>&1; then
    want=hip
  else
    echo "ci/gpu.sh: no NVIDIA GPU (nvidia-smi) or AMD GPU (rocminfo) answers here; run it on a GPU runner," \
         "or .ci/run for the CPU and OpenCL CI" >&2
    exit 2
  fi
fi
case $want in
  cuda)
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
    if ! [[ $cc =~ ^[0-9]+$ ]]; then
      echo "ci/gpu.sh: nvidia-smi gave no compute capability ('$cc'); the driver is too old for --query-gpu=compute_cap" >&2
      exit 2
    fi
    args=(-DOSCAR_CUDA=ON -DOSCAR_HIP=OFF "-DOSCAR_CUDA_ARCHS=$cc")
    [ "$cc" = 90 ] || echo "ci/gpu.sh: compute capability $cc; the kernels are tuned and tested on 9.0 only" >&2 ;;
  hip)
    isa=$(rocminfo | grep -o -m1 'gfx[0-9a-f]\+' || true)
    if [ -z "$isa" ]; then
      echo "ci/gpu.sh: rocminfo names no gfx ISA; is an AMD GPU visible to this runner?" >&2
      exit 2
    fi
    args=(-DOSCAR_HIP=ON -DOSCAR_CUDA=OFF "-DOSCAR_HIP_ARCHS=$isa")
    echo "ci/gpu.sh: $isa; the HIP kernels had never run on an AMD GPU when this script was written" >&2 ;;
  *)
    echo "usage: bash ci/gpu.sh [cuda|hip]" >&2
    exit 2 ;;
esac
B=${OSCAR_GPU_CI_BUILD:-build-gpu}
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DOSCAR_OPENCL=OFF -DOSCAR_WERROR=ON "${args[@]}"
cmake --build "$B" -j"$(nproc)"
export OSCAR_REQUIRE_BACKENDS=$want OSCAR_PLUGIN_PATH=$PWD/$B/lib
ctest --test-dir "$B" --output-on-failure \
  -R '^(test_backend_conformance|test_bad_input|test_bad_input_alias|test_plan_threads|test_workspace|test_cuda_graph|test_gpu_splits)$'

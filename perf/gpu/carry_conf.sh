#!/usr/bin/env bash
# Builds tests/test_backend_conformance (and the GPU cases of test_bad_input
# and test_plan_threads) on this (dev) machine into
# build-carry-conf/ with the shared libraries it needs (Criterion and its
# dependencies) in build-carry-conf/lib, so perf/gpu/run.sh can run it on the
# GPU machine, whose image has no Criterion:
#   bash perf/gpu/carry_conf.sh   then   run(..., carry=["build-carry-conf"])
set -euo pipefail
cd "$(dirname "$0")/../.."
B=build-carry-conf-obj
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DOSCAR_CUDA=OFF -DOSCAR_HIP=OFF -DOSCAR_OPENCL=OFF \
      -DOSCAR_GEN_SET=minimal -DOSCAR_WERROR=ON > /dev/null
tests="test_backend_conformance test_bad_input test_bad_input_alias test_plan_threads test_cuda_graph test_workspace test_per_layer_pages"
# shellcheck disable=SC2086
cmake --build $B -j2 --target $tests > /dev/null
rm -rf build-carry-conf && mkdir -p build-carry-conf/lib
for t in $tests; do
  exe=$(find $B -name $t -type f -perm -u+x | head -1)
  cp "$exe" build-carry-conf/
done
# Everything they link except the C library and the loader (present there).
for t in $tests; do ldd build-carry-conf/$t; done | sort -u | awk '/=> \//{print $3}' | grep -vE '/(libc|libm|libpthread|libdl|librt|ld-linux)[.-]' |
  while read -r so; do cp -L "$so" build-carry-conf/lib/; done
du -sh build-carry-conf; ls build-carry-conf/lib

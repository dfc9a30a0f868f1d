#!/usr/bin/env bash
# Which change breaks a conformance case of the long-chunk kernel (device machine, one call): builds
# three CUDA plugins of one small variant set (default perf/gpu/set-d64-f16.json: the d 64 F16 shape
# of extend/long_chunk_kernel) in parallel, this tree for sm_90a (the wgmma path where the tree has
# it), this tree for sm_90, and an archived tree for sm_90, then runs the case ROUNDS times on each
# with the default split count and with OSCAR_EXTEND_FA_SPLITS=3. Needs the carried test binaries and
# the archive (perf/gpu/ab_tree.sh's header says how to make both):
#   run(command="bash perf/gpu/fa_bisect.sh", carry=[".devcarry/conf.tar.xz", ".devcarry/base.tar.xz"])
# Env: SET (a variant-set file under perf/gpu), FILTER (a Criterion filter), ROUNDS (default 2).
set -u
cd "$(dirname "$0")/../.."
SET=${SET:-set-d64-f16.json}
FILTER=${FILTER:-extend/long_chunk_kernel}
[ -d build-carry-conf ] || tar -xJf .devcarry/conf.tar.xz
mkdir -p /tmp/base && tar -xJf .devcarry/base.tar.xz -C /tmp/base && cp "perf/gpu/$SET" /tmp/base/perf/gpu/
bld() { # tree, build dir, arch
  cmake -S "$1/perf/gpu" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOSCAR_GEN_SET="$1/perf/gpu/$SET" \
    -DOSCAR_CUDA_ARCHS="$3" -DCMAKE_CUDA_ARCHITECTURES="$3" > "$2.log" 2>&1 &&
    ninja -C "$2" oscar_backend_cuda >> "$2.log" 2>&1
  echo "$2 ($1, $3): build rc=$? at ${SECONDS}s"
}
bld "$PWD" /tmp/fb-90a 90a & bld "$PWD" /tmp/fb-90 90 & bld /tmp/base /tmp/fb-base 90 & wait
export LD_LIBRARY_PATH=$PWD/build-carry-conf/lib OSCAR_REQUIRE_BACKENDS=cuda
for i in $(seq "${ROUNDS:-2}"); do
  for p in fb-90a fb-90 fb-base; do
    for s in "" 3; do
      OSCAR_EXTEND_FA_SPLITS=$s OSCAR_PLUGIN_PATH=/tmp/$p/lib timeout 120 build-carry-conf/test_backend_conformance \
        --jobs 4 --filter "$FILTER" > /tmp/fb.txt 2>&1
      echo "$p splits '${s:-default}': rc=$? $(grep -c 'outputs off\| off;' /tmp/fb.txt) failing;" \
        "$(grep -o 'seed [0-9]* .*tol [0-9.e+-]*)' /tmp/fb.txt | head -1 | cut -c1-200)"
    done
  done
done
nvidia-smi --query-gpu=name --format=csv,noheader

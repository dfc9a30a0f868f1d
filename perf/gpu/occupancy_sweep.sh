#!/usr/bin/env bash
# Occupancy sweep of the tensor-core decode (device machine): builds the plugin
# with tuning.sm_90.tc_decode.ctas_per_sm = 4, 5, 6 and times a few points of
# bench_attention twice each (edits gen/variants.json in the copy it runs on).
set -u
cd "$(dirname "$0")/../.."
for occ in 4 5 6; do
  sed -i "s/\"ctas_per_sm\": [0-9]*/\"ctas_per_sm\": $occ/" gen/variants.json
  B=/tmp/ob$occ
  cmake -S perf/gpu -B $B -G Ninja -DOSCAR_GEN_SET=minimal -DCMAKE_BUILD_TYPE=Release > /tmp/b$occ.log 2>&1 && cmake --build $B -j16 >> /tmp/b$occ.log 2>&1 || { tail -20 /tmp/b$occ.log; exit 1; }
done
for occ in 4 5 6 4 5 6; do
  echo "== occ $occ"
  OSCAR_BENCH_METHODS=oscar2 OSCAR_BENCH_CASES=8x4096,64x4096,8x32768,32x32768,64x32768,1x131072,8x131072,32x131072 /tmp/ob$occ/bench_attention /tmp/ob$occ/lib/liboscar_backend_cuda.so /tmp/o.tsv | grep "^oscar2 " | awk '{print $2, $3, $4, $5}'
done

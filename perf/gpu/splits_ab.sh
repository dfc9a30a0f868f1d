#!/usr/bin/env bash
# The tensor-core decode's split count A/B (device machine): one build (minimal variant set,
# built here unless OSCAR_BENCH_BUILD names a prebuilt one), timed with the wave model's choice
# ("auto") and with OSCAR_DECODE_SPLITS=N forced for each N given, two interleaved rounds
# (perf/gpu/decode_ab.sh); table in $OUT/decode_ab.md (ratios: auto / forced, > 1 = forced faster).
#   bash perf/gpu/splits_ab.sh "1 2 3 4 6" [SHAPE ...]        cases: OSCAR_BENCH_CASES (BxL,...)
set -uo pipefail
cd "$(dirname "$0")/../.."
ns=${1:-"1 2 3 4 6 8"}
shift || true
B=${OSCAR_BENCH_BUILD:-/tmp/oscar-bench-splits}
if ! [ -x "$B/bench_attention" ]; then
  t0=$(date +%s)
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S perf/gpu -B "$B" "${gen[@]}" -DOSCAR_GEN_SET=minimal -DCMAKE_BUILD_TYPE=Release > /tmp/splits-build.log 2>&1 &&
    cmake --build "$B" -j"$(nproc)" >> /tmp/splits-build.log 2>&1 || { tail -30 /tmp/splits-build.log; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
fi
export OSCAR_BENCH_CASES=${OSCAR_BENCH_CASES:-172x8192,128x8192,64x32768,32x32768,8x32768,1x131072}
builds=("auto=$B")
for n in $ns; do builds+=("s$n=$B@OSCAR_DECODE_SPLITS=$n"); done
bash perf/gpu/decode_ab.sh "${builds[@]}" -- "${@:-32/8/128}"

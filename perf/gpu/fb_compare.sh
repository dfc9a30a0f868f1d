#!/usr/bin/env bash
# A/B timing of the error-feedback write path (device machine): builds the CUDA
# plugin and the benchmark (minimal variant set: the benchmark's d 128 / group 128
# plan) once per variant and times `oscar2-fb` (plus `oscar2`, nearest) appends,
# variants interleaved over two rounds so drift hits all alike.
#   bash perf/gpu/fb_compare.sh NAME[=OVERLAY][:CUDAFLAGS] ...
# NAME=OVERLAY: a copy of the working tree with the files under OVERLAY (same
# relative paths, e.g. the previous templates/append.jinja) laid over it;
# :CUDAFLAGS: extra nvcc flags (a macro the template tests, say).
# Env: OSCAR_BENCH_PREFILL (default 512). Example, previous kernel against the tree:
#   mkdir -p build-x/templates && git show HEAD~1:templates/append.jinja > build-x/templates/append.jinja
#   run(bash perf/gpu/fb_compare.sh base=build-x new, carry=["build-x"])
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-/tmp/oscar-out}
mkdir -p "$OUT"
export OSCAR_BENCH_FB=1 OSCAR_BENCH_METHODS=oscar2 OSCAR_BENCH_PREFILL=${OSCAR_BENCH_PREFILL:-512}
names=()
for spec in "$@"; do
  name=${spec%%[=:]*}
  flags=""
  [[ $spec == *:* ]] && flags=${spec#*:}
  src=$ROOT
  head=${spec%%:*}
  if [[ $head == *=* ]]; then
    overlay=${head#*=}
    src=/tmp/fbtree-$name
    rm -rf "$src" && mkdir -p "$src"
    (cd "$ROOT" && tar --exclude='./build*' --exclude=./.git --exclude=./.devcarry -cf - .) | tar -xf - -C "$src"
    cp -r "$ROOT/$overlay/." "$src/"
  fi
  # builds run side by side (the append file is one long nvcc job each)
  (cmake -S "$src/perf/gpu" -B /tmp/fbb-$name -G Ninja -DOSCAR_GEN_SET=minimal -DCMAKE_BUILD_TYPE=Release \
     "-DCMAKE_CUDA_FLAGS=$flags" > "$OUT/build-$name.log" 2>&1 &&
     cmake --build /tmp/fbb-$name -j8 >> "$OUT/build-$name.log" 2>&1 || echo "BUILD $name FAILED" >> "$OUT/build-$name.log") &
  names+=("$name")
done
t0=$(date +%s)
wait
echo "builds: $(( $(date +%s) - t0 )) s"
for name in "${names[@]}"; do
  grep -q "FAILED" "$OUT/build-$name.log" && { tail -30 "$OUT/build-$name.log"; exit 1; }
done
for round in 1 2; do
  for name in "${names[@]}"; do
    echo "== $name round $round"
    timeout 200 /tmp/fbb-$name/bench_attention /tmp/fbb-$name/lib/liboscar_backend_cuda.so /tmp/fb-$name.tsv quick 2>&1 |
      grep -E "append|variant" | sed -E 's/ +[0-9.]+ MB.*append/ append/'
  done
done
# FB_NCU="NAME ...": Nsight Compute durations of the feedback plan's demote and
# store launches (B=1, 4K, caches kept warm as in the timed loop; the first 46
# launches belong to the nearest-rounding plan), then warp stall reasons of one
# feedback demote launch of the last NAME.
if [ -n "${FB_NCU:-}" ] && command -v ncu > /dev/null; then
  export OSCAR_BENCH_PREFILL=0 OSCAR_BENCH_CASES=1x4096
  for name in $FB_NCU; do
    timeout 60 ncu --clock-control none --cache-control none --kernel-name regex:'oscar_(demote|store)' \
      --launch-skip 52 --launch-count 6 --metrics gpu__time_duration.sum /tmp/fbb-$name/bench_attention \
      /tmp/fbb-$name/lib/liboscar_backend_cuda.so /tmp/fbn.tsv > "$OUT/ncu-t-$name.txt" 2>&1
    echo "$name kernel us: $(grep -E "oscar_(demote|store)|gpu__time" "$OUT/ncu-t-$name.txt" |
      awk '/oscar_/{k=($0 ~ /demote/) ? "demote" : "store"} /gpu__time/{printf "%s %s  ", k, $NF}')"
  done
  m=smsp__average_warps_issue_stalled
  metrics=""
  for r in long_scoreboard short_scoreboard wait math_pipe_throttle mio_throttle lg_throttle barrier membar \
           not_selected selected dispatch_stall no_instruction branch_resolving drain misc; do
    metrics="$metrics,${m}_${r}_per_issue_active.ratio"
  done
  metrics="${metrics#,},gpu__time_duration.sum,smsp__inst_executed.sum,launch__registers_per_thread"
  timeout 60 ncu --clock-control none --cache-control none --kernel-name regex:oscar_demote \
    --launch-skip 26 --launch-count 1 --metrics "$metrics" /tmp/fbb-$name/bench_attention \
    /tmp/fbb-$name/lib/liboscar_backend_cuda.so /tmp/fbn.tsv > "$OUT/ncu-$name.txt" 2>&1
  grep -E "ratio|sum|regist" "$OUT/ncu-$name.txt" | sed "s/${m}_//" | awk '$NF > 0.05 {print $1, $NF}' | sort -k2 -rn | tr '\n' ';'
  echo
fi

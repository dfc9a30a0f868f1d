#!/usr/bin/env bash
# Times oscar-calibrate on tiny-qwen3 over the first 64K calibration tokens
# (32 windows of 2048): RUNS runs (default 3), median of each figure, as a
# markdown table on stdout. Builds a non-sanitizer tree first.
#   perf/calib/run.sh [BUILD_DIR]     (default build-perf-calib)
# Env: OSCAR_SHARED_DIR (default ../shared), RUNS, EXTRA (more oscar-calibrate flags),
# BASE_BIN (another oscar-calibrate, e.g. of the commit before a speed-up: each run of this tree's
# binary is followed by one of it, so both see the same machine load; its table is printed second
# and the two parameter files are compared with cmp).
# The CPU-time rows (process, all threads) are the figures to compare on a machine shared with
# other work; wall time is only meaningful when the machine is otherwise idle (load average ~0).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-perf-calib}
shared=${OSCAR_SHARED_DIR:-$root/../shared}
runs=${RUNS:-3}
out=$(mktemp -d /tmp/oscar-calib-perf.XXXXXX)
trap 'rm -rf "$out"' EXIT

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOSCAR_SANITIZE=OFF -DOSCAR_CUDA=OFF \
      -DOSCAR_HIP=OFF -DOSCAR_OPENCL=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target oscar-calibrate >/dev/null

# run_one BIN TAG I: one calibration, its output in $out/TAG-run$I.txt (and the load average after it).
run_one() {
  # shellcheck disable=SC2086
  "$1" "$shared/models/tiny-qwen3" --tokens "$shared/data/tiny-qwen3/calib.tokens" \
      --out "$out/$2.safetensors" --max-tokens 65536 --window 2048 ${EXTRA:-} >"$out/$2-run$3.txt" 2>/dev/null
  echo "load $(cut -d' ' -f1 /proc/loadavg)" >>"$out/$2-run$3.txt"
  echo "$2 run $3: $(grep '^wall time' "$out/$2-run$3.txt")  load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
}
for i in $(seq 1 "$runs"); do
  run_one "$build/bin/oscar-calibrate" tree "$i"
  if [ -n "${BASE_BIN:-}" ]; then run_one "$BASE_BIN" base "$i"; fi
done

# One row per run: wall, cpu, pass0 s, pass0 tok/s, pass1 s, pass1 tok/s, finalize s, peak MiB,
# pass0 CPU s, finalize CPU s (the CPU line exists since the finalize speed-up; "-" before), load after.
rows() {
  for i in $(seq 1 "$runs"); do
    f=$out/$1-run$i.txt
    p0=$(grep '^pass 0:' "$f"); p1=$(grep '^pass 1:' "$f"); wt=$(grep '^wall time' "$f")
    cpu=$( (grep '^CPU time per phase' "$f" || true) | sed -E 's/^CPU time per phase: pass 0 ([0-9.]+) s, pass 1 [0-9.]+ s, finalize ([0-9.]+) s.*/\1 \2/')
    echo "$(echo "$wt" | sed -E 's/^wall time ([0-9.]+) s.*CPU time ([0-9.]+) s, peak memory ([0-9]+) MiB.*/\1 \2 \3/') \
$(echo "$p0" | sed -E 's/^pass 0: ([0-9.]+) s \(([0-9]+) tokens.*/\1 \2/') \
$(echo "$p1" | sed -E 's/^pass 1: ([0-9.]+) s \(([0-9]+) tokens.*/\1 \2/') \
$(grep '^finalize:' "$f" | sed -E 's/^finalize: ([0-9.]+) s.*/\1/') ${cpu:-- -} $(sed -nE 's/^load ([0-9.]+)$/\1/p' "$f")"
  done
}

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
table() { # TAG TITLE
  rows "$1" >"$out/rows-$1.txt"
  echo "$2, median of $runs runs ${EXTRA:+(flags: $EXTRA)}"
  echo
  echo "| figure | median | runs |"
  echo "|---|---|---|"
  names=("wall time (s)" "CPU time (s)" "peak memory (MiB)" "pass 0 (s)" "pass 0 (tokens/s)" "pass 1 (s)" "pass 1 (tokens/s)" "finalize (s)" "pass 0 CPU (s)" "finalize CPU (s)" "load average after the run")
  for c in $(seq 1 11); do
    echo "| ${names[$((c-1))]} | $(awk -v c="$c" '{print $c}' "$out/rows-$1.txt" | median) | $(awk -v c=$c '{printf "%s%s", (NR>1?", ":""), $c}' "$out/rows-$1.txt") |"
  done
  echo
}
echo "CPU: $(lscpu | sed -nE 's/^Model name:[[:space:]]+//p'), $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ)"
echo
table tree "oscar-calibrate tiny-qwen3 (this tree), 65536 tokens (32 x 2048)"
echo "pass 1: $(sed -nE 's/^pass 1: [^;]+; ([^,]+),.*/\1/p' "$out/tree-run1.txt")"
if [ -n "${BASE_BIN:-}" ]; then
  echo
  table base "the same with $BASE_BIN"
  if cmp -s "$out/tree.safetensors" "$out/base.safetensors"; then echo "parameter files: identical (cmp)"
  else echo "parameter files: DIFFER (cmp)"; fi
fi

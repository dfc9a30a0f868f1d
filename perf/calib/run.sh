#!/usr/bin/env bash
# Times oscar-calibrate on tiny-qwen3 over the first 64K calibration tokens
# (32 windows of 2048): RUNS runs (default 3), median of each figure, as a
# markdown table on stdout. Builds a non-sanitizer tree first.
#   perf/calib/run.sh [BUILD_DIR]     (default build-perf-calib)
# Env: OSCAR_SHARED_DIR (default ../shared), RUNS, EXTRA (more oscar-calibrate flags).
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

for i in $(seq 1 "$runs"); do
  # shellcheck disable=SC2086
  "$build/bin/oscar-calibrate" "$shared/models/tiny-qwen3" --tokens "$shared/data/tiny-qwen3/calib.tokens" \
      --out "$out/params.safetensors" --max-tokens 65536 --window 2048 ${EXTRA:-} >"$out/run$i.txt" 2>/dev/null
  echo "run $i: $(grep '^wall time' "$out/run$i.txt")  load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
done

# One row per run: wall, cpu, pass0 s, pass0 tok/s, pass1 s, pass1 tok/s, finalize s, peak MiB.
for i in $(seq 1 "$runs"); do
  f=$out/run$i.txt
  p0=$(grep '^pass 0:' "$f"); p1=$(grep '^pass 1:' "$f"); wt=$(grep '^wall time' "$f")
  echo "$(echo "$wt" | sed -E 's/^wall time ([0-9.]+) s.*CPU time ([0-9.]+) s, peak memory ([0-9]+) MiB.*/\1 \2 \3/') \
$(echo "$p0" | sed -E 's/^pass 0: ([0-9.]+) s \(([0-9]+) tokens.*/\1 \2/') \
$(echo "$p1" | sed -E 's/^pass 1: ([0-9.]+) s \(([0-9]+) tokens.*/\1 \2/') \
$(grep '^finalize:' "$f" | sed -E 's/^finalize: ([0-9.]+) s.*/\1/')"
done >"$out/rows.txt"

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
col() { awk -v c="$1" '{print $c}' "$out/rows.txt" | median; }
echo "CPU: $(lscpu | sed -nE 's/^Model name:[[:space:]]+//p'), $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ)"
echo "oscar-calibrate tiny-qwen3, 65536 tokens (32 x 2048), median of $runs runs ${EXTRA:+(flags: $EXTRA)}"
echo
echo "| figure | median | runs |"
echo "|---|---|---|"
names=("wall time (s)" "CPU time (s)" "peak memory (MiB)" "pass 0 (s)" "pass 0 (tokens/s)" "pass 1 (s)" "pass 1 (tokens/s)" "finalize (s)")
for c in 1 2 3 4 5 6 7 8; do
  echo "| ${names[$((c-1))]} | $(col $c) | $(awk -v c=$c '{printf "%s%s", (NR>1?", ":""), $c}' "$out/rows.txt") |"
done
echo
echo "pass 1: $(sed -nE 's/^pass 1: [^;]+; ([^,]+),.*/\1/p' "$out/run1.txt")"

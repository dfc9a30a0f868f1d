#!/usr/bin/env bash
# The long-chunk extend over the model zoo (device machine): for each shape, bench_attention's
# oscar_extend with the default rule at n query tokens per sequence (one run), then torch SDPA (BF16,
# FlashAttention backend, lower-right causal mask) at the same points; one table row per point.
# Needs a built benchmark (perf/gpu/check_extend.sh with NO_TESTS=1 NO_AB=1 builds one):
#   OSCAR_BENCH_BUILD=/tmp/oscar-extend bash perf/gpu/extend_zoo.sh
# Env: SHAPES (HQ/HKV/D list), CASES (BxL list), N (default 512), OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${OSCAR_BENCH_BUILD:-/tmp/oscar-extend}
O=${OUT:-/tmp/extend-zoo}
N=${N:-512}
SHAPES=${SHAPES:-"32/8/128 64/8/128 96/8/128 28/4/128 32/32/128 32/8/64 16/4/64"}
mkdir -p "$O"
export OSCAR_BENCH_CASES=${CASES:-1x32768,32x32768} OSCAR_BENCH_METHODS=oscar2 OSCAR_BENCH_EXTEND=$N
echo "| shape | batch x context | n | oscar_extend us | one decode step us | x decode | SDPA us | x SDPA |"
echo "|---|---|---|---|---|---|---|---|"
for s in $SHAPES; do
  f=${s//\//_}
  OSCAR_BENCH_EXTEND_TSV="$O/ext-$f.tsv" timeout 120 "$B/bench_attention" "$B/lib/liboscar_backend_cuda.so" \
    "$O/dec-$f.tsv" "$s" > "$O/log-$f.txt" 2>&1 || { echo "| $s | bench failed: $(tail -1 "$O/log-$f.txt") |"; continue; }
  OSCAR_SDPA_QLEN=$N timeout 120 python3 perf/gpu/sdpa_bench.py "$O/sdpa-$f.tsv" "$s/128" > "$O/sdpa-$f.log" 2>&1 ||
    tail -3 "$O/sdpa-$f.log"
  python3 - "$O/ext-$f.tsv" "$O/sdpa-$f.tsv" "$s" <<'PY'
import csv, os, sys
ext, sd, shape = sys.argv[1:4]
sdpa = {}
if os.path.exists(sd):
    for r in csv.reader(open(sd), delimiter="\t"):
        try:
            sdpa[(int(r[2]), int(r[3]))] = float(r[4])
        except (ValueError, IndexError):
            pass  # the header
for r in csv.reader(open(ext), delimiter="\t"):
    try:
        b, l, n, us, dec = int(r[2]), int(r[3]), int(r[4]), float(r[5]), float(r[6])
    except (ValueError, IndexError):
        continue
    s = sdpa.get((b, l))
    print("| %s | %d x %d | %d | %.1f | %.1f | %.2f | %s | %s |" % (shape, b, l, n, us, dec, us / dec,
          "%.1f" % s if s else "-", "%.2f" % (us / s) if s else "-"))
PY
done
nvidia-smi --query-gpu=name --format=csv,noheader

#!/usr/bin/env bash
# Speculative verify (issue 13): oscar_extend at n = 4, 8, 16, 32 query tokens per sequence against one
# decode step, the default rule (the decode family's extend below 64 (query row, head) pairs per KV head)
# beside the long-chunk kernel forced from one pair (OSCAR_EXTEND_FA=1: its CTAs of 64 pairs then run
# partly empty), interleaved rounds in one process each. Needs a built benchmark, e.g.
#   NO_TESTS=1 NO_AB=1 CUDA_ARCHS=90a bash perf/gpu/check_extend.sh
#   OSCAR_BENCH_BUILD=/tmp/oscar-extend bash perf/gpu/verify_ab.sh
# Env: SHAPES (HQ/HKV/D list), CASES (BxL list), NS (n list), ROUNDS, OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${OSCAR_BENCH_BUILD:-/tmp/oscar-extend}
O=${OUT:-/tmp/verify-ab}
mkdir -p "$O"
export OSCAR_BENCH_CASES=${CASES:-32x32768,1x32768} OSCAR_BENCH_METHODS=oscar2 OSCAR_BENCH_EXTEND=${NS:-4,8,16,32}
for s in ${SHAPES:-32/8/128 64/8/128 28/4/128}; do
  f=${s//\//_}
  for r in $(seq "${ROUNDS:-2}"); do
    for fa in rule fa; do
      if [ $fa = fa ]; then export OSCAR_EXTEND_FA=1; else unset OSCAR_EXTEND_FA; fi
      OSCAR_BENCH_EXTEND_TSV="$O/$fa-$f-$r.tsv" timeout 120 "$B/bench_attention" "$B/lib/liboscar_backend_cuda.so" \
        "$O/dec-$f.tsv" "$s" > "$O/log-$fa-$f-$r.txt" 2>&1 || echo "$s $fa round $r failed: $(tail -1 "$O/log-$fa-$f-$r.txt")"
    done
  done
done
unset OSCAR_EXTEND_FA
python3 - "$O" <<'PY'
import csv, glob, os, statistics, sys
o = sys.argv[1]
rows = {}
for path in glob.glob(os.path.join(o, "*-*-*.tsv")):
    kind, rest = os.path.basename(path).split("-", 1)
    if kind not in ("rule", "fa"):
        continue
    shape = rest.rsplit("-", 1)[0].replace("_", "/")
    for r in csv.reader(open(path), delimiter="\t"):
        try:
            b, l, n, us, dec = int(r[2]), int(r[3]), int(r[4]), float(r[5]), float(r[6])
        except (ValueError, IndexError):
            continue
        d = rows.setdefault((shape, b, l, n), {"rule": [], "fa": [], "dec": []})
        d[kind].append(us)
        d["dec"].append(dec)
print("| shape | batch x context | n | decode step us | rule us (x decode) | long-chunk forced us (x decode) |")
print("|---|---|---|---|---|---|")
for (shape, b, l, n), d in sorted(rows.items()):
    dec = statistics.median(d["dec"])
    cell = lambda xs: "%.1f (%.2f)" % (statistics.median(xs), statistics.median(xs) / dec) if xs else "-"
    print("| %s | %d x %d | %d | %.1f | %s | %s |" % (shape, b, l, n, dec, cell(d["rule"]), cell(d["fa"])))
PY
nvidia-smi --query-gpu=name --format=csv,noheader

#!/usr/bin/env bash
# Decode A/B timing on the device machine: the 2-bit decode of each build
# given, interleaved over two rounds so clock drift hits all alike; writes
# $OUT/decode_ab.md (median us per build and the ratio to the first build).
#   bash perf/gpu/decode_ab.sh NAME=BUILD ... [-- SHAPE ...]
# BUILD: a folder with bench_attention and lib/liboscar_backend_cuda.so.
# SHAPE: HQ/HKV/D[/G] (default 32/8/128); cases: OSCAR_BENCH_CASES (BxL,...).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/oscar-out}
mkdir -p "$OUT"
. perf/gpu/ab_rounds.sh
ab_args "$@"
export OSCAR_BENCH_METHODS=${OSCAR_BENCH_METHODS:-oscar2}
export OSCAR_BENCH_CASES=${OSCAR_BENCH_CASES:-1x131072,8x32768,32x32768}
ab_rounds ab
python3 - "$OUT/decode_ab.md" "${builds[@]}" <<'PY'
import csv, statistics, sys
out, builds = sys.argv[1], [b.split("=")[0] for b in sys.argv[2:]]
rows = {}
for name in builds:
    for r in (1, 2):
        for row in csv.DictReader(open("/tmp/ab-%s-%d.tsv" % (name, r)), delimiter="\t"):
            if not row.get("batch") or not row.get("median_us"):
                continue
            key = (row["shape"], row["method"], int(row["batch"]), int(row["context"]))
            rows.setdefault(key, {}).setdefault(name, []).append((float(row["median_us"]), float(row["frac_copy"])))
head = "| shape | method | batch | context | " + " | ".join("%s us (%% roofline)" % n for n in builds) + \
       "".join(" | %s / %s" % (builds[0], n) for n in builds[1:]) + " |"
lines = [head, "|" + "---|" * (4 + 2 * len(builds) - 1)]
for key in sorted(rows):
    med = {n: statistics.median(v[0] for v in rows[key][n]) for n in builds if n in rows[key]}
    fr = {n: statistics.median(v[1] for v in rows[key][n]) for n in builds if n in rows[key]}
    cells = ["%.1f (%.0f%%)" % (med[n], 100 * fr[n]) if n in med else "-" for n in builds]
    cells += ["%.3f" % (med[builds[0]] / med[n]) if n in med and builds[0] in med else "-" for n in builds[1:]]
    lines.append("| %s | %s | %d | %d | " % key + " | ".join(cells) + " |")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY

#!/usr/bin/env bash
# Write-path timing on the device machine: the append of one decode step (one
# new token per sequence: the leaving window row demoted, the new row rotated
# and stored) with nearest rounding and with error-feedback weights, batch
# 1..256 at 4K context, for each build given (A/B runs interleaved over two
# rounds so drift hits all alike). Writes $OUT/write_path.md (medians, us).
#   bash perf/gpu/write_path.sh NAME=BUILD ... [-- SHAPE ...]
# BUILD: a folder with bench_attention and lib/liboscar_backend_cuda.so.
# SHAPE: HQ/HKV/D[/G] (default 32/8/128, the Qwen3-8B layer).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/oscar-out}
mkdir -p "$OUT"
. perf/gpu/ab_rounds.sh
ab_args "$@"
export OSCAR_BENCH_FB=1 OSCAR_BENCH_METHODS=oscar2 OSCAR_BENCH_PREFILL=${OSCAR_BENCH_PREFILL:-0}
export OSCAR_BENCH_CASES=${OSCAR_BENCH_CASES:-1x4096,8x4096,32x4096,64x4096,128x4096,256x4096}
ab_rounds wp prefill
python3 - "$OUT/write_path.md" "${builds[@]}" <<'PY'
import csv, statistics, sys
out, builds = sys.argv[1], [b.split("=")[0] for b in sys.argv[2:]]
rows = {}
for name in builds:
    for r in (1, 2):
        for row in csv.DictReader(open("/tmp/wp-%s-%d.tsv" % (name, r)), delimiter="\t"):
            if not row.get("batch") or not row.get("append_us"):
                continue
            key = (row["shape"], int(row["batch"]), int(row["context"]))
            rows.setdefault(key, {}).setdefault((name, row["method"]), []).append(float(row["append_us"]))
head = "| shape | batch | context | " + " | ".join("%s nearest us | %s feedback us" % (n, n) for n in builds) + " |"
lines = [head, "|" + "---|" * (3 + 2 * len(builds))]
for key in sorted(rows):
    cells = []
    for n in builds:
        for m in ("oscar2", "oscar2-fb"):
            v = rows[key].get((n, m))
            cells.append("%.1f" % statistics.median(v) if v else "-")
    lines.append("| %s | %d | %d | " % key + " | ".join(cells) + " |")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY

#!/usr/bin/env python3
"""Markdown table of an A/B run (perf/gpu/ab_rounds.sh: /tmp/TAG-NAME-ROUND.tsv,
two rounds per build), medians over the rounds.
    ab_table.py decode OUT.md TAG NAME=BUILD ...   2-bit decode us, % roofline, ratios to the first build
    ab_table.py write OUT.md TAG NAME=BUILD ...    append us, nearest and feedback per build, each alone
                                                   (idle GPU between calls) and back to back ("stream")"""
import csv
import statistics
import sys

kind, out, tag = sys.argv[1:4]
builds = [b.split("=")[0] for b in sys.argv[4:]]
rows = {}
for name in builds:
    for r in (1, 2):
        for row in csv.DictReader(open("/tmp/%s-%s-%d.tsv" % (tag, name, r)), delimiter="\t"):
            col = "median_us" if kind == "decode" else "append_us"
            if not row.get("batch") or not row.get(col):
                continue
            if kind == "decode":
                key, sub = (row["shape"], row["method"], int(row["batch"]), int(row["context"])), name
                val = (float(row["median_us"]), float(row["frac_copy"]))
            else:
                key, sub = (row["shape"], int(row["batch"]), int(row["context"])), (name, row["method"])
                val = (float(row["append_us"]), float(row.get("append_stream_us") or "nan"))
            rows.setdefault(key, {}).setdefault(sub, []).append(val)
if kind == "decode":
    head = "| shape | method | batch | context | " + " | ".join("%s us (%% roofline)" % n for n in builds) + \
           "".join(" | %s / %s" % (builds[0], n) for n in builds[1:]) + " |"
    lines = [head, "|" + "---|" * (4 + 2 * len(builds) - 1)]
    for key in sorted(rows):
        med = {n: statistics.median(v[0] for v in rows[key][n]) for n in builds if n in rows[key]}
        fr = {n: statistics.median(v[1] for v in rows[key][n]) for n in builds if n in rows[key]}
        cells = ["%.1f (%.0f%%)" % (med[n], 100 * fr[n]) if n in med else "-" for n in builds]
        cells += ["%.3f" % (med[builds[0]] / med[n]) if n in med and builds[0] in med else "-" for n in builds[1:]]
        lines.append("| %s | %s | %d | %d | " % key + " | ".join(cells) + " |")
else:
    head = "| shape | batch | context | " + " | ".join(
        "%s nearest us | %s feedback us | %s nearest stream us | %s feedback stream us" % (n, n, n, n)
        for n in builds) + " |"
    lines = [head, "|" + "---|" * (3 + 4 * len(builds))]
    for key in sorted(rows):
        cells = []
        for n in builds:
            for i in (0, 1):
                for m in ("oscar2", "oscar2-fb"):
                    v = rows[key].get((n, m))
                    cells.append("%.1f" % statistics.median(x[i] for x in v) if v else "-")
        lines.append("| %s | %d | %d | " % key + " | ".join(cells) + " |")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))

#!/usr/bin/env python3
"""Markdown table of a W3 A/B run (perf/gpu/decode_ab.sh with OSCAR_BENCH_WIDE=n: the oscar2 and
oscar2-w3 plans of each build, /tmp/TAG-NAME-ROUND.tsv): per shape and point, each build's time of the
layer with 3-bit head-tensors and its ratio to the same build's 2-bit layer (medians of the rounds),
then the geometric mean and the largest ratio per build.
    w3_table.py TAG NAME[=BUILD] ...    (table on stdout)"""
import csv
import glob
import math
import statistics
import sys

tag, names = sys.argv[1], [a.split("=")[0] for a in sys.argv[2:]]
times = {}
for name in names:
    for path in glob.glob("/tmp/%s-%s-[12].tsv" % (tag, name)):
        for row in csv.DictReader(open(path), delimiter="\t"):
            if row.get("batch") and row.get("median_us"):
                key = (name, row["shape"], row["method"], int(row["batch"]), int(row["context"]))
                times.setdefault(key, []).append(float(row["median_us"]))
points = sorted({k[1:] for k in times if k[2] == "oscar2-w3"}, key=lambda k: (k[0], k[2], k[3]))
print("| shape | batch x context | " + " | ".join("%s: W3 layer us (x 2-bit layer)" % n for n in names) + " |")
print("|---|---|" + "---|" * len(names))
ratios = {n: [] for n in names}
for shape, _, batch, ctx in points:
    cells = []
    for n in names:
        w3, two = times.get((n, shape, "oscar2-w3", batch, ctx)), times.get((n, shape, "oscar2", batch, ctx))
        if not (w3 and two):
            cells.append("-")
            continue
        r = statistics.median(w3) / statistics.median(two)
        ratios[n].append(r)
        cells.append("%.1f (%.2f)" % (statistics.median(w3), r))
    print("| %s | %d x %dK | %s |" % (shape, batch, ctx // 1024, " | ".join(cells)))
print()
for n in names:
    if ratios[n]:
        gm = math.exp(sum(map(math.log, ratios[n])) / len(ratios[n]))
        print("- %s: geometric mean %.3fx a 2-bit layer, largest %.3fx (%d points)" % (n, gm, max(ratios[n]), len(ratios[n])))

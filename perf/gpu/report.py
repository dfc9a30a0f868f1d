#!/usr/bin/env python3
"""Joins bench_attention's and sdpa_bench's TSV files into the Markdown table
of perf/RESULTS-attention.md.   report.py oscar.tsv sdpa.tsv"""
import sys


def read(path):
    rows, meta = [], {}
    try:
        with open(path) as f:
            head = None
            for line in f:
                line = line.rstrip("\n")
                if line.startswith("#"):
                    k, v = line[1:].split("\t")
                    meta[k] = float(v)
                    continue
                cols = line.split("\t")
                if head is None:
                    head = cols
                    continue
                rows.append(dict(zip(head, cols)))
    except FileNotFoundError:
        pass
    return rows, meta


osc, meta = read(sys.argv[1])
sdpa, _ = read(sys.argv[2])
by = {}
for r in osc:
    by[(r["method"], int(r["batch"]), int(r["context"]))] = r
sd = {(int(r["batch"]), int(r["context"])): r for r in sdpa}
keys = sorted({(b, l) for (_, b, l) in by}, key=lambda k: (k[1], k[0]))
copy = meta.get("copy_GBps", 0)
print("Copy roofline (device-to-device, read + write): %.0f GB/s\n" % copy)
print("| batch | context | 2-bit us | 2-bit GB/s | % roofline | BF16-paged us | SDPA us (backend) | x vs SDPA |"
      " x vs BF16-paged | append us | append % of decode |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for b, l in keys:
    o = by.get(("oscar2", b, l))
    f = by.get(("bf16-paged", b, l))
    s = sd.get((b, l))
    if not o:
        continue
    t = float(o["median_us"])
    line = "| %d | %dK | %.1f | %.0f | %.0f%% | " % (b, l // 1024, t, float(o["GBps"]), 100 * float(o["frac_copy"]))
    line += ("%.1f | " % float(f["median_us"])) if f else "- | "
    line += ("%.1f (%s) | " % (float(s["median_us"]), s["backend"][:5])) if s else "- | "
    line += ("%.2f | " % (float(s["median_us"]) / t)) if s else "- | "
    line += ("%.2f | " % (float(f["median_us"]) / t)) if f else "- | "
    line += "%.1f | %.1f%% |" % (float(o["append_us"]), 100 * float(o["append_us"]) / t)
    print(line)

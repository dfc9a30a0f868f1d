#!/usr/bin/env python3
"""Joins bench_attention's and sdpa_bench's TSV files into the Markdown tables
of perf/RESULTS-attention.md: one row per (shape, batch, context) with the
2-bit decode, the library's BF16 paged decode and torch SDPA side by side,
then a per-shape summary against the targets of the decode issue.
    report.py oscar.tsv sdpa.tsv"""
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


def main():
    osc, meta = read(sys.argv[1])
    sdpa, _ = read(sys.argv[2])
    by = {(r["shape"], r["method"], int(r["batch"]), int(r["context"])): r for r in osc}
    sd = {(r["shape"], int(r["batch"]), int(r["context"])): r for r in sdpa}
    shapes = []
    for r in osc:
        if r["shape"] not in shapes:
            shapes.append(r["shape"])
    copy = meta.get("copy_GBps", 0)
    print("Copy roofline (device-to-device, read + write): %.0f GB/s\n" % copy)
    print("| shape Hq/Hkv/d/g | batch | context | 2-bit us | 2-bit GB/s | % roofline | BF16-paged us | BF16-paged %"
          " roofline | SDPA us | x vs SDPA | BF16-paged vs SDPA | append us |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    summary = []
    for sh in shapes:
        keys = sorted({(b, l) for (s, _, b, l) in by if s == sh}, key=lambda k: (k[1], k[0]))
        fr, xs, bf, bfr = [], {}, [], []
        for b, l in keys:
            o, f, s = by.get((sh, "oscar2", b, l)), by.get((sh, "bf16-paged", b, l)), sd.get((sh, b, l))
            if not o:
                continue
            t = float(o["median_us"])
            ts = float(s["median_us"]) if s else None
            line = "| %s | %d | %dK | %.1f | %.0f | %.0f%% | " % (sh, b, l // 1024, t, float(o["GBps"]),
                                                                  100 * float(o["frac_copy"]))
            line += ("%.1f | %.0f%% | " % (float(f["median_us"]), 100 * float(f["frac_copy"]))) if f else "- | - | "
            line += ("%.1f | %.2f | " % (ts, ts / t)) if s else "- | - | "
            line += ("%.2f | " % (ts / float(f["median_us"]))) if (s and f) else "- | "
            line += "%.1f |" % float(o["append_us"])
            print(line)
            if b >= 8 and l >= 32768:
                fr.append(float(o["frac_copy"]))
                if f:
                    bfr.append(float(f["frac_copy"]))
            if ts:
                xs[(b, l)] = ts / t
                if f:
                    bf.append(ts / float(f["median_us"]))
        var = by.get((sh, "oscar2", keys[0][0], keys[0][1]), {}).get("splits_variant", "?") if keys else "?"
        summary.append((sh, var, min(fr) if fr else None, max(fr) if fr else None, xs.get((32, 32768)),
                        xs.get((1, 131072)), min(bfr) if bfr else None, min(bf) if bf else None,
                        max(bf) if bf else None))
    print("\n| shape | 2-bit variant | 2-bit % roofline (B >= 8, L >= 32K) | x SDPA B32 x 32K | x SDPA B1 x 128K |"
          " BF16-paged % roofline (B >= 8, L >= 32K) | BF16-paged / SDPA speed (all points) |")
    print("|---|---|---|---|---|---|---|")
    pct = lambda v: ("%.0f%%" % (100 * v)) if v is not None else "-"
    num = lambda v: ("%.2f" % v) if v is not None else "-"
    for sh, var, fr0, fr1, x32, x1, bfr0, bf0, bf1 in summary:
        print("| %s | %s | %s-%s | %s | %s | %s+ | %s-%s |" % (sh, var, pct(fr0), pct(fr1), num(x32), num(x1),
                                                               pct(bfr0), num(bf0), num(bf1)))


if __name__ == "__main__":
    main()

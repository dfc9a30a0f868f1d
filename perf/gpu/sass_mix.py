#!/usr/bin/env python3
"""Per-instruction profile of one kernel, from Nsight Compute's source page:
   ncu -i REPORT.ncu-rep --page source --csv --print-source sass > S.csv
   python3 perf/gpu/sass_mix.py S.csv [TILES] [TOP]
Prints the stall reasons over all samples, the samples and executions by opcode, and
the TOP most-stalled instructions with their three largest reasons. TILES (e.g. the
number of 32-token tiles the launch ran) turns executions into instructions per tile."""
import collections
import csv
import re
import sys


def main():
    rows = list(csv.reader(open(sys.argv[1])))
    tiles = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    hdr = next(r for r in rows if "Source" in r and "Instructions Executed" in r)
    ix = {h: i for i, h in enumerate(hdr)}
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    ins = []
    for r in rows[rows.index(hdr) + 1:]:
        try:
            ex = int(r[ix["Instructions Executed"]])
            smp = int(r[ix["Warp Stall Sampling (All Samples)"]])
        except (ValueError, IndexError):
            continue
        src = r[ix["Source"]].strip()
        words = src.split()
        if not words:
            continue
        op = (words[1] if words[0].startswith("@") and len(words) > 1 else words[0]).split(".")[0]
        ins.append((src, op, ex, smp, {k: int(r[ix[k]] or 0) for k in stalls}))
    total = sum(i[3] for i in ins) or 1
    reasons = collections.Counter()
    by_op, ex_op = collections.Counter(), collections.Counter()
    for src, op, ex, smp, st in ins:
        reasons.update(st)
        by_op[op] += smp
        ex_op[op] += ex
    print("samples %d, instructions executed %d%s" % (total, sum(ex_op.values()),
          ", per tile %.0f" % (sum(ex_op.values()) / tiles) if tiles else ""))
    print("stalls: " + ", ".join("%s %.1f%%" % (k[6:], 100.0 * v / total) for k, v in reasons.most_common(8)))
    print("by opcode (share of samples, executed%s):" % (" per tile" if tiles else ""))
    for op, v in by_op.most_common(20):
        n = ex_op[op] / tiles if tiles else ex_op[op]
        print("  %-8s %5.1f%%  %10.1f" % (op, 100.0 * v / total, n))
    print("most-stalled instructions:")
    for src, op, ex, smp, st in sorted(ins, key=lambda i: -i[3])[:top]:
        why = sorted(st.items(), key=lambda kv: -kv[1])[:3]
        print("  %6d %10d  %-58s %s" % (smp, ex, re.sub(r"\s+", " ", src)[:58],
                                        " ".join("%s:%d" % (k[6:], v) for k, v in why)))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Roofline plot of one perf/gpu/run.sh: achieved GB/s (bytes the decode must
read over its median time) of the 2-bit decode, the library's BF16 paged
decode and torch SDPA, per shape and (batch, context) point, with the measured
copy bandwidth drawn in.   plot.py oscar.tsv sdpa.tsv out.png"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from report import read  # noqa: E402


def main():
    osc, meta = read(sys.argv[1])
    sdpa, _ = read(sys.argv[2])
    shapes = []
    for r in osc:
        if r["shape"] not in shapes:
            shapes.append(r["shape"])
    copy = meta.get("copy_GBps", 0)
    ncol = min(4, len(shapes))
    nrow = (len(shapes) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.4 * ncol, 3.3 * nrow), sharey=True, squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[len(shapes):]:
        ax.axis("off")
    for ax, sh in zip(flat, shapes):
        pts = sorted({(int(r["batch"]), int(r["context"])) for r in osc if r["shape"] == sh},
                     key=lambda k: (k[1], k[0]))
        x = range(len(pts))
        for method, mk, col in (("oscar2", "o", "tab:red"), ("bf16-paged", "s", "tab:blue")):
            d = {(int(r["batch"]), int(r["context"])): float(r["GBps"]) for r in osc
                 if r["shape"] == sh and r["method"] == method}
            ax.plot(x, [d.get(p, float("nan")) for p in pts], mk + "-", color=col, ms=4,
                    label="2-bit" if method == "oscar2" else "BF16 paged (ours)")
        d = {(int(r["batch"]), int(r["context"])): float(r["GBps"]) for r in sdpa if r["shape"] == sh}
        ax.plot(x, [d.get(p, float("nan")) for p in pts], "^--", color="tab:gray", ms=4, label="SDPA (BF16)")
        ax.axhline(copy, color="k", lw=0.8, ls=":", label="copy roofline")
        ax.set_title(sh, fontsize=9)
        ax.set_xticks(list(x))
        ax.set_xticklabels(["%dx%dK" % (b, l // 1024) for b, l in pts], rotation=90, fontsize=6)
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel("GB/s (bytes it must read)", fontsize=8)
    flat[0].legend(fontsize=7, loc="upper left")
    fig.suptitle("Decode attention on the H200 (batch x context per shape Hq/Hkv/d/group)", fontsize=10)
    fig.tight_layout()
    fig.savefig(sys.argv[3], dpi=110)


if __name__ == "__main__":
    main()

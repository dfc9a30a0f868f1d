#!/usr/bin/env bash
# Extend attention A/B on the device machine: bench_attention's oscar_extend (n query tokens per
# sequence over the same cache) with the long-chunk kernel's rule (default) and without it
# (OSCAR_EXTEND_FA=0: the decode family's extend alone; or BASE_SO, another plugin), two interleaved
# rounds, then torch SDPA
# (BF16, FlashAttention backend, n queries with a lower-right causal mask) at the same points.
#   bash perf/gpu/extend_ab.sh     (env: SHAPE=32/8/128 CASES=1x32768,32x32768 NS=4,8,64,512
#                                   OSCAR_BENCH_BUILD=dir GEN_SET=minimal OUT=dir)
# Prints one row per (batch, context, n): median us off / on per round, SDPA us, on / SDPA.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${OSCAR_BENCH_BUILD:-/tmp/oscar-bench}
O=${OUT:-/tmp/extend-ab}
SHAPE=${SHAPE:-32/8/128}
NS=${NS:-4,8,64,512}
mkdir -p "$O"
if [ ! -x "$B/bench_attention" ]; then
  { cmake -S perf/gpu -B "$B" -G Ninja -DOSCAR_GEN_SET="${GEN_SET:-minimal}" -DCMAKE_BUILD_TYPE=Release &&
    ninja -C "$B"; } > "$O/build.log" 2>&1 || { tail -40 "$O/build.log"; echo "BUILD FAILED"; exit 1; }
fi
so=$B/lib/liboscar_backend_cuda.so
export OSCAR_BENCH_CASES=${CASES:-1x32768,32x32768} OSCAR_BENCH_METHODS=oscar2 OSCAR_BENCH_EXTEND=$NS
# BASE_SO=path: "off" is that plugin (e.g. built from an earlier tree) with its defaults instead;
# FA_ON=1: the "on" rounds with OSCAR_EXTEND_FA=1 (the long-chunk kernel for every n >= 2, e.g. verify)
for round in 1 2; do
  for fa in off on; do
    p=$so
    if [ $fa = off ] && [ -n "${BASE_SO:-}" ]; then p=$BASE_SO; unset OSCAR_EXTEND_FA
    elif [ $fa = off ]; then export OSCAR_EXTEND_FA=0
    elif [ -n "${FA_ON:-}" ]; then export OSCAR_EXTEND_FA=$FA_ON; else unset OSCAR_EXTEND_FA; fi
    OSCAR_BENCH_EXTEND_TSV="$O/ext-$fa-$round.tsv" "$B/bench_attention" "$p" "$O/dec-$fa-$round.tsv" "$SHAPE" \
      > "$O/log-$fa-$round.txt" 2>&1 || { tail -20 "$O/log-$fa-$round.txt"; exit 1; }
  done
done
unset OSCAR_EXTEND_FA
for n in ${NS//,/ }; do
  OSCAR_SDPA_QLEN=$n python3 perf/gpu/sdpa_bench.py "$O/sdpa-$n.tsv" "$SHAPE/128" > "$O/sdpa-$n.log" 2>&1 ||
    tail -5 "$O/sdpa-$n.log"
done
python3 - "$O" "$NS" <<'EOF'
import csv, glob, os, sys
o, ns = sys.argv[1], [int(x) for x in sys.argv[2].split(",")]
ext = {}
for f in glob.glob(os.path.join(o, "ext-*-*.tsv")):
    fa, rnd = os.path.basename(f)[4:-4].split("-")
    for r in csv.reader(open(f), delimiter="\t"):
        try:
            ext.setdefault((int(r[2]), int(r[3]), int(r[4])), {})[(fa, rnd)] = (float(r[5]), float(r[6]))
        except (ValueError, IndexError):
            pass  # the header
sdpa = {}
for n in ns:
    f = os.path.join(o, "sdpa-%d.tsv" % n)
    if os.path.exists(f):
        for r in csv.reader(open(f), delimiter="\t"):
            try:
                sdpa[(int(r[2]), int(r[3]), n)] = float(r[4])
            except (ValueError, IndexError):
                pass
print("| batch x context | n | off us (r1 / r2) | on us (r1 / r2) | on / off | one decode step us | on / decode | SDPA us | on / SDPA |")
print("|---|---|---|---|---|---|---|---|---|")
for k in sorted(ext):
    v = ext[k]
    off = [v[("off", r)][0] for r in "12" if ("off", r) in v]
    on = [v[("on", r)][0] for r in "12" if ("on", r) in v]
    dec = v.get(("on", "1"), v.get(("off", "1")))[1]
    s = sdpa.get(k)
    bo, bn = min(off), min(on)
    print("| %d x %d | %d | %s | %s | %.3f | %.1f | %.2f | %s | %s |" % (
        k[0], k[1], k[2], " / ".join("%.1f" % x for x in off), " / ".join("%.1f" % x for x in on), bn / bo, dec,
        bn / dec, "%.1f" % s if s else "-", "%.2f" % (bn / s) if s else "-"))
EOF

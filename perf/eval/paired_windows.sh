#!/bin/sh
# Paired per-window comparison of two methods on the default evaluation
# windows (docs/EVAL.md): window w = eval.tokens [2048 w, 2048 w + 2049), each
# run alone through oscar-eval (no retrieval), then the mean and standard
# error over windows of the per-window differences in KL and mean NLL.
# Usage: perf/eval/paired_windows.sh BUILD_DIR PARAMS [A B] [WINDOWS]
# (defaults: A = oscar2, B = kivi2, 16 windows). Reporting only: nothing is
# chosen from it.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$1; PARAMS=$2; A=${3:-oscar2}; B=${4:-kivi2}; NW=${5:-16}
SHARED=${OSCAR_SHARED_DIR:-$ROOT/../shared}
WORK=$(mktemp -d /tmp/oscar-paired.XXXXXX)
python3 - "$SHARED/data/tiny-qwen3/eval.tokens" "$WORK" "$NW" <<'PY'
import sys
d = open(sys.argv[1], 'rb').read()
for w in range(int(sys.argv[3])):
    open('%s/w%02d.tokens' % (sys.argv[2], w), 'wb').write(d[w * 2048 * 4:(w * 2048 + 2049) * 4])
PY
w=0
while [ $w -lt "$NW" ]; do
  f=$(printf '%s/w%02d' "$WORK" $w)
  "$BUILD/bin/oscar-eval" "$SHARED/models/tiny-qwen3" --params "$PARAMS" --tokens $f.tokens \
      --methods bf16,$A,$B --context 2048 --max-tokens 2048 --sink 64 --recent 256 --retrieval-trials 0 \
      --threads 1 --out $f.json --md $f.md > $f.log 2>&1
  w=$((w + 1))
done
python3 - "$WORK" "$NW" "$A" "$B" <<'PY'
import json, math, sys
work, n, A, B = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = [json.load(open('%s/w%02d.json' % (work, w)))['methods'] for w in range(n)]
def ms(x):
    m = sum(x) / len(x)
    return m, math.sqrt(sum((a - m) ** 2 for a in x) / (len(x) - 1) / len(x))
dk = [r[A]['kl'] - r[B]['kl'] for r in rows]
dn = [r[A]['mean_nll'] - r[B]['mean_nll'] for r in rows]
nll = {k: sum(r[k]['mean_nll'] for r in rows) / n for k in ('bf16', A, B)}
print('%d windows; ppl bf16 %.4f, %s %.4f, %s %.4f' % (n, math.exp(nll['bf16']), A, math.exp(nll[A]), B, math.exp(nll[B])))
print('KL  %s - %s: mean %+.5f, standard error %.5f; %s lower on %d of %d windows' % (A, B, *ms(dk), A, sum(x < 0 for x in dk), n))
m, se = ms(dn)
print('NLL %s - %s: mean %+.6f, standard error %.6f (ppl difference ~ %+.4f +- %.4f); %s lower on %d of %d windows'
      % (A, B, m, se, math.exp(nll[A]) * m, math.exp(nll[A]) * se, A, sum(x < 0 for x in dn), n))
PY
rm -rf "$WORK"

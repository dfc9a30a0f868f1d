#!/usr/bin/env bash
# Seventeenth session (helper branch acc17). Usage as in README.md; OPENBLAS_NUM_THREADS=1, nice 15, one thread.
# ev.sh NAME PARAMS TOKENS MAXTOK TRIALS SINK RECENT [more]
set -euo pipefail
O=/work/acc-out; B=${B:-/work/wt-acc/build/bin}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OE_THREADS=1
n=$1; p=$2; tk=$3; mt=$4; tr=$5; s=$6; r=$7; shift 7
/usr/bin/time -f "%e s wall, %U s user" -o $O/$n.time nice -n 15 $B/oscar-eval /work/shared/models/tiny-qwen3 --params $p --tokens $tk --methods ${METHODS:-bf16,oscar2} --context 2048 --max-tokens $mt --retrieval-trials $tr --sink $s --recent $r --threads 1 --out $O/$n.json --md $O/$n.md "$@" 2> $O/$n.err

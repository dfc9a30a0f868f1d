#!/usr/bin/env bash
# Seventeenth session (helper branch acc17). Usage as in README.md; OPENBLAS_NUM_THREADS=1, nice 15, one thread.
# cal.sh NAME TOKENS [options]  -> /work/acc-out/NAME.safetensors, .txt, .time
set -euo pipefail
O=/work/acc-out; B=${B:-/work/wt-acc/build/bin}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
n=$1; tk=$2; shift 2
/usr/bin/time -f "%e s wall, %U s user" -o $O/$n.time nice -n 15 $B/oscar-calibrate /work/shared/models/tiny-qwen3 --tokens $tk --threads 1 --out $O/$n.safetensors "$@" > $O/$n.txt 2> $O/$n.err

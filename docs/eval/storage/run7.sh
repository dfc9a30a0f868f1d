#!/usr/bin/env bash
# The seventh step of docs/eval/retrieval.md (issue 16): calibration-only levers for s0w0 and for the
# windowed default (the error-feedback ridge --feedback-damp; the free direction, an experiment), the
# s0w0 diagnoses (groups of 32 on every head, key statistics, feedback pivots), eval.tokens.
# Usage: docs/eval/storage/run7.sh [BUILD_DIR] [OLD_BUILD_DIR] [OUT_DIR]   (from the repository root)
#   BUILD_DIR: this tree. OLD_BUILD_DIR: commit cc04a4c with step7/experiments.patch applied (its
#   environment switches are off by default, so without them it calibrates exactly as cc04a4c and as
#   this tree's default; OSCAR_EXP_DAMP=1e-2 is the ridge 1e-2 as a double, which this tree's float
#   option --feedback-damp 0.01 is not byte for byte).
# ~70 min on the loaded 2-core machine.
set -euo pipefail
B=${1:-build-y}; OB=${2:-build}; O=${3:-/tmp/oscar-storage7}
. "$(dirname "$0")/slices.sh" # valA, valB, calib2.tokens (and the text-2 default file, unused here)
T1=$D/calib.tokens; T2=$O/calib2.tokens
cal() { # cal BUILD OUT TOKENS [args]: one calibration, its report in OUT.cal.log
    local b=$1 out=$2 tok=$3; shift 3
    /usr/bin/time -f "%e s wall %U s user" "$b/bin/oscar-calibrate" "$M" --tokens "$tok" --threads 2 \
        --out "$O/$out.st" "$@" > "$O/$out.cal.log" 2>&1
}
ev() { # ev PARAMS TOKENS TAG SINK RECENT [args]
    local p=$1 t=$2 tag=$3 s0=$4 w=$5; shift 5
    "$B/bin/oscar-eval" "$M" --params "$p" --tokens "$t" --methods bf16,oscar2 --context 2048 --sink "$s0" --recent "$w" \
        --threads 2 --out "$O/$tag.json" --md "$O/$tag.md" "$@" 2> "$O/$tag.log"
}
# s0w0: the default (ridge 1e-3) and ridge 1e-2, texts 1 and 2
cal "$OB" base "$T1" --sink 0 --recent 0
cal "$OB" t2base "$T2" --sink 0 --recent 0
OSCAR_EXP_DAMP=1e-2 cal "$OB" damp1e-2 "$T1" --sink 0 --recent 0
OSCAR_EXP_DAMP=1e-2 cal "$OB" t2damp1e-2 "$T2" --sink 0 --recent 0
for f in base t2base damp1e-2 t2damp1e-2; do
    for s in valA valB; do ev "$O/$f.st" "$O/$s.tokens" "$f-$s" 0 0 --max-tokens 16384 --retrieval-trials 0; done
done
OSCAR_EXP_DAMP=1e-1 cal "$OB" damp1e-1 "$T1" --sink 0 --recent 0
ev "$O/damp1e-1.st" "$O/valA.tokens" damp1e-1-valA 0 0 --max-tokens 16384 --retrieval-trials 0
# eval.tokens, s0w0 (16 windows, no retrieval trials)
for f in base damp1e-2 t2base t2damp1e-2; do
    ev "$O/$f.st" "$D/eval.tokens" "s0w0-eval-$f" 0 0 --max-tokens 32768 --retrieval-trials 0
done
# s0w0 diagnosis, valA's first 4 windows: every head's keys, or values, in groups of 32 (2.625 bits/elt)
ev "$O/base.st" "$O/valA.tokens" diag-kv 0 0 --max-tokens 8192 --retrieval-trials 0 --storage group=32,kv=k \
    --storage group=32,kv=v
# with windows: ridge 0.001 (the default's value as the float option) against 0.01, texts 1 and 2
cal "$B" w-base "$T1" --feedback-damp 0.001
cal "$B" w-damp "$T1" --feedback-damp 0.01
cal "$B" w-t2base "$T2" --feedback-damp 0.001
cal "$B" w-t2damp "$T2" --feedback-damp 0.01
for f in w-base w-damp w-t2base w-t2damp; do
    for s in valA valB; do ev "$O/$f.st" "$O/$s.tokens" "$f-$s" 64 256 --max-tokens 16384 --retrieval-trials 8; done
done
# the windowed default is unchanged: this tree's default file equals cc04a4c's
cal "$B" y-w-t1 "$T1"
cal "$OB" old-w-t1 "$T1"
cmp "$O/y-w-t1.st" "$O/old-w-t1.st" && echo "windowed default: byte-identical to cc04a4c"
for s in valA valB; do ev "$O/y-w-t1.st" "$O/$s.tokens" "y-w-t1-$s" 64 256 --max-tokens 16384 --retrieval-trials 8; done
cal "$B" y-s0w0-t1 "$T1" --sink 0 --recent 0
cmp "$O/y-s0w0-t1.st" "$O/base.st" && echo "s0w0 default: byte-identical to cc04a4c"
# Experiments that need OLD_BUILD_DIR's switches (step7/experiments.patch), s0w0, text 1:
#   free direction = the keys' top second-moment direction (valA, valB)
OSCAR_EXP_FREE=1 cal "$OB" freek "$T1" --sink 0 --recent 0
for s in valA valB; do ev "$O/freek.st" "$O/$s.tokens" "freek-$s" 0 0 --max-tokens 16384 --retrieval-trials 0; done
#   key statistics: mean, rotated-row range (STAT lines, 65536 tokens); top key direction (KE) and
#   feedback pivots (PIV), 8192 tokens
OSCAR_EXP_STATS=1 cal "$OB" stats "$T1" --sink 0 --recent 0
OSCAR_EXP_KE=1 OSCAR_EXP_PIV=1 cal "$OB" stats8k "$T1" --sink 0 --recent 0 --max-tokens 8192

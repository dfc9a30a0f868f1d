#!/usr/bin/env bash
# Issue 16, fourteenth step (docs/eval/retrieval.md): the code-width budget as the default of
# oscar-calibrate. tiny-qwen3 calibrated on two texts with the new default (--wide-bits 0.05) and with
# --wide-bits 0 (2 bits everywhere), each evaluated on the two validation slices (the protocol of
# docs/EVAL.md "How the defaults were chosen"; text 2 on 4 windows as in the ninth step).
# Usage: docs/eval/wide-default/run.sh BUILD_DIR   (from the repository root; outputs in $OUT)
set -euo pipefail
B=${1:-build}/bin
S=${SHARED:-../shared}
T=$S/data/tiny-qwen3
MQ=$S/models/tiny-qwen3
O=${OUT:-/tmp/wide-default}
mkdir -p "$O"
dd if=$T/calib.tokens of=$O/calib2.tokens bs=4 skip=196608 count=65536 status=none
dd if=$T/calib.tokens of=$O/valA.tokens bs=4 skip=131072 status=none
dd if=$T/calib.tokens of=$O/valB.tokens bs=4 skip=327680 status=none
cal() { "$B/oscar-calibrate" "$1" --tokens "$2" --threads 2 --out "$O/$3.safetensors" "${@:4}" > "$O/$3.txt" 2> "$O/$3.err"; }
cal $MQ $T/calib.tokens q1w --wide-bits 0.05   # = the new default (cmp after the change)
cal $MQ $T/calib.tokens q1 --wide-bits 0
cal $MQ $O/calib2.tokens q2w --wide-bits 0.05
cal $MQ $O/calib2.tokens q2 --wide-bits 0
ev() { # name params tokens max-tokens trials
  "$B/oscar-eval" $MQ --params "$O/$2.safetensors" --tokens "$3" --methods bf16,oscar2 --context 2048 \
      --max-tokens "$4" --sink 64 --recent 256 --retrieval-trials "$5" --threads 2 --out "$O/$1.json" --md "$O/$1.md"; }
ev t1A-q1w q1w $O/valA.tokens 16384 8; ev t1A-q1 q1 $O/valA.tokens 16384 8
ev t1B-q1w q1w $O/valB.tokens 16384 8; ev t1B-q1 q1 $O/valB.tokens 16384 8
ev t2A-q2w q2w $O/valA.tokens 8192 8;  ev t2A-q2 q2 $O/valA.tokens 8192 8
ev t2B-q2w q2w $O/valB.tokens 8192 8;  ev t2B-q2 q2 $O/valB.tokens 8192 8

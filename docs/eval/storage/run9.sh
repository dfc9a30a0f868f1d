#!/usr/bin/env bash
# Ninth step of docs/eval/retrieval.md: the code-width rule (oscar-calibrate --wide-bits) on tiny-qwen3
# with two calibration texts and on the held-out tiny-llama, then oscar-eval of each file with and without
# the widened head-tensor (real storage: oscar_fakequant reads the file's code_bits). What was run on
# the 2-core machine, one command after the other; outputs in $O (the reports are in storage/step9/).
# Usage: docs/eval/storage/run9.sh BUILD_DIR TINY_LLAMA_DIR   (from the repository root)
set -euo pipefail
B=${1:-build}/bin
ML=${2:-/work/models-local/tiny-llama-t}  # docs/eval/tiny-llama/train_torch.py's model
S=${SHARED:-../shared}
T=$S/data/tiny-qwen3
MQ=$S/models/tiny-qwen3
O=${OUT:-/tmp/step9}
mkdir -p "$O"
# slices of calib.tokens (uint32): text 2 = [196608, 262144), valA from 131072, valB from 327680
dd if=$T/calib.tokens of=$O/calib2.tokens bs=4 skip=196608 count=65536 status=none
dd if=$T/calib.tokens of=$O/valA.tokens bs=4 skip=131072 status=none
dd if=$T/calib.tokens of=$O/valB.tokens bs=4 skip=327680 status=none
cal() { "$B/oscar-calibrate" "$1" --tokens "$2" --threads 2 --out "$O/$3.safetensors" "${@:4}" > "$O/$3.txt" 2> "$O/$3.err"; }
cal $MQ $T/calib.tokens q1w --wide-bits 0.05
cal $MQ $O/calib2.tokens q2w --wide-bits 0.05
cal $ML $T/calib.tokens lw --wide-bits 0.05
cal $MQ $T/calib.tokens q1
cal $MQ $O/calib2.tokens q2
cal $ML $T/calib.tokens l
cal $ML $T/calib.tokens lw2 --wide-bits 0.084
ev() { # name model params tokens max-tokens trials [more options]
  "$B/oscar-eval" "$2" --params "$O/$3.safetensors" --tokens "$4" --methods "${METHODS:-bf16,oscar2}" --context 2048 \
      --max-tokens "$5" --sink 64 --recent 256 --retrieval-trials "$6" --threads 2 --out "$O/$1.json" --md "$O/$1.md" "${@:7}"; }
ev t1A-q1 $MQ q1 $O/valA.tokens 16384 8;  ev t1A-q1w $MQ q1w $O/valA.tokens 16384 8
ev t1B-q1 $MQ q1 $O/valB.tokens 16384 8;  ev t1B-q1w $MQ q1w $O/valB.tokens 16384 8
METHODS=bf16,kivi2,oscar2 ev L-l $ML l $T/eval.tokens 32768 4
ev L-lw $ML lw $T/eval.tokens 32768 4;    ev L-lw2 $ML lw2 $T/eval.tokens 32768 4
ev t2A-q2 $MQ q2 $O/valA.tokens 8192 8;   ev t2A-q2w $MQ q2w $O/valA.tokens 8192 8
ev t2B-q2 $MQ q2 $O/valB.tokens 8192 8;   ev t2B-q2w $MQ q2w $O/valB.tokens 8192 8
ev E-q1 $MQ q1 $T/eval.tokens 32768 4;    ev E-q1w $MQ q1w $T/eval.tokens 32768 4
# the held-out model's single head-tensors in 3 bits (fake-quant storage specs on the 2-bit file)
ev L-alt $ML l $T/eval.tokens 32768 4 --storage bits=3,kv=k,heads=4:1,clip=1 --storage bits=3,kv=k,heads=4:0,clip=1 \
   --storage bits=3,kv=k,heads=3:0,clip=1 --storage bits=3,kv=k,heads=5:0,clip=1 --storage bits=3,kv=v,heads=3:0,clip=1
"$B/oscar-copy-probe" $ML --tokens $T/calib.tokens --params "$O/l.safetensors" --trials 2 > "$O/cp-llama.txt"

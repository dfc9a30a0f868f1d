#!/bin/bash
# ninth step: calibrations without widths (same machine and build), then evaluations; progress in ev.log
B=/work/wt-acc10/build/bin
S=/work/shared
T=$S/data/tiny-qwen3
cd /tmp/acc10
cal() { /usr/bin/time -f "$3: %e s wall %U s user" $B/oscar-calibrate $1 --tokens $2 --threads 2 --out $3.safetensors ${@:4} > $3.txt 2>$3.err; tail -1 $3.err; }
ev() { # name model params tokens maxtok trials [extra]
  /usr/bin/time -f "$1: %e s wall %U s user" $B/oscar-eval $2 --params $3 --tokens $4 --methods ${METHODS:-bf16,oscar2} --context 2048 --max-tokens $5 \
     --sink 64 --recent 256 --retrieval-trials $6 --threads 2 --out $1.json --md $1.md ${@:7} > $1.out 2> $1.err; tail -1 $1.err; }
cal $S/models/tiny-qwen3 $T/calib.tokens q1
cal $S/models/tiny-qwen3 calib2.tokens q2
cal /work/models-local/tiny-llama-t $T/calib.tokens l
ev t1A-q1 $S/models/tiny-qwen3 q1.safetensors valA.tokens 16384 8
ev t1A-q1w $S/models/tiny-qwen3 q1w.safetensors valA.tokens 16384 8
ev t1B-q1 $S/models/tiny-qwen3 q1.safetensors valB.tokens 16384 8
ev t1B-q1w $S/models/tiny-qwen3 q1w.safetensors valB.tokens 16384 8
METHODS=bf16,kivi2,oscar2 ev L-l /work/models-local/tiny-llama-t l.safetensors $T/eval.tokens 32768 4
ev L-lw /work/models-local/tiny-llama-t lw.safetensors $T/eval.tokens 32768 4
ev t2A-q2 $S/models/tiny-qwen3 q2.safetensors valA.tokens 8192 8
ev t2A-q2w $S/models/tiny-qwen3 q2w.safetensors valA.tokens 8192 8
ev t2B-q2 $S/models/tiny-qwen3 q2.safetensors valB.tokens 8192 8
ev t2B-q2w $S/models/tiny-qwen3 q2w.safetensors valB.tokens 8192 8
ev E-q1 $S/models/tiny-qwen3 q1.safetensors $T/eval.tokens 32768 4
ev E-q1w $S/models/tiny-qwen3 q1w.safetensors $T/eval.tokens 32768 4
echo ALLDONE

#!/usr/bin/env bash
# Fourteenth session (helper a14): 3-bit head-tensors (oscar-calibrate --wide-bits X) without windows
# (s0w0) and as X grows, on tiny-qwen3 and the held-out tiny-llama. What was run on the shared 2-core
# machine; parameter files and raw reports go to $O (not committed: 4.2 MB each); the tables kept are
# in this folder (README.md, raw/*.md).
# Usage: docs/eval/wide-s0w0/run.sh BUILD_DIR [STAGE...]   (from the repository root)
#   stages: cal-s0 cal-w cal-l cal-ls0 cal-s0t2 ev-s0 ev-w ev-l ev-ls0 ev-s0t2 ev-s0t2E ev-s0t2x ev-wv ev-wr (default: all, in that order)
#   XS="0 0.05 ..." picks the budgets (default 0 0.05 0.1 0.2; 0 = the plain 2-bit calibration)
# The invocations of the fourteenth session (OUT=/work/a14out, BUILD_DIR build-a), in order:
#   run.sh build-a cal-s0;  run.sh build-a cal-w cal-l ev-s0 ev-w ev-l
#   XS=0.0625 run.sh build-a cal-s0 ev-s0 cal-w ev-w
#   run.sh build-a cal-ls0 ev-ls0 cal-s0t2 ev-s0t2 ev-wv
#   XS='0 0.05 0.0625 0.1' run.sh build-a ev-wr
#   XS=0.0625 run.sh build-a cal-s0t2 ev-s0t2;  XS='0.0625 0 0.05 0.1' run.sh build-a ev-s0t2E
#   XS=0.0625 run.sh build-a ev-wv;  XS=0.2 run.sh build-a ev-wr ev-s0t2E;  run.sh build-a ev-s0t2x
#   python3 docs/eval/wide-s0w0/tables.py $OUT > docs/eval/wide-s0w0/raw/tables.md
set -euo pipefail
B=${1:-build}/bin; shift || true
S=${SHARED:-../shared}
T=$S/data/tiny-qwen3
MQ=$S/models/tiny-qwen3
ML=${TINY_LLAMA:-/work/models-local/tiny-llama-t}   # docs/eval/tiny-llama/train_torch.py's model
O=${OUT:-/tmp/wide-s0w0}
XS=${XS:-"0 0.05 0.1 0.2"}
mkdir -p "$O"
# slices of calib.tokens (uint32), as docs/eval/storage/run9.sh: text 2 = [196608, 262144),
# valA from 131072, valB from 327680 (text 1 = [0, 65536), what oscar-calibrate reads by default)
[ -f "$O/calib2.tokens" ] || dd if=$T/calib.tokens of=$O/calib2.tokens bs=4 skip=196608 count=65536 status=none
[ -f "$O/valA.tokens" ] || dd if=$T/calib.tokens of=$O/valA.tokens bs=4 skip=131072 status=none
[ -f "$O/valB.tokens" ] || dd if=$T/calib.tokens of=$O/valB.tokens bs=4 skip=327680 status=none
tag() { [ "$1" = 0 ] && echo 2b || echo "w${1#0.}"; }   # 0 -> 2b, 0.05 -> w05, 0.1 -> w1, 0.2 -> w2
cal() { # name model tokens [options]; X = 0 is the plain 2-bit calibration (no --wide-bits)
  /usr/bin/time -f "%e s wall, %U s user" -o "$O/$1.time" \
    "$B/oscar-calibrate" "$2" --tokens "$3" --threads 2 --out "$O/$1.safetensors" "${@:4}" > "$O/$1.txt" 2> "$O/$1.err"; }
wb() { [ "$1" = 0 ] || echo "--wide-bits $1"; }
ev() { # name model params tokens max-tokens trials sink recent [more options]
  /usr/bin/time -f "%e s wall, %U s user" -o "$O/$1.time" \
    "$B/oscar-eval" "$2" --params "$O/$3.safetensors" --tokens "$4" --methods "${METHODS:-bf16,oscar2}" \
    --context 2048 --max-tokens "$5" --retrieval-trials "$6" --sink "$7" --recent "$8" --threads 2 \
    --out "$O/$1.json" --md "$O/$1.md" "${@:9}" 2> "$O/$1.err"; }
stages=${*:-cal-s0 cal-w cal-l cal-ls0 cal-s0t2 ev-s0 ev-w ev-l ev-ls0 ev-s0t2 ev-s0t2E ev-s0t2x ev-wv ev-wr}
for st in $stages; do case $st in
  # s0w0 calibration as docs/EVAL.md's s0w0 steps: --sink 0 --recent 0 (16 probe positions by default)
  cal-s0)   for x in $XS; do cal q1s-$(tag $x) $MQ $T/calib.tokens --sink 0 --recent 0 $(wb $x); done ;;
  cal-s0t2) for x in $XS; do cal q2s-$(tag $x) $MQ $O/calib2.tokens --sink 0 --recent 0 $(wb $x); done ;;
  # windows 64/256: the library defaults
  cal-w)    for x in $XS; do cal q1-$(tag $x) $MQ $T/calib.tokens $(wb $x); done ;;
  cal-l)    for x in $XS; do cal l-$(tag $x) $ML $T/calib.tokens $(wb $x); done ;;
  cal-ls0)  for x in $XS; do cal ls-$(tag $x) $ML $T/calib.tokens --sink 0 --recent 0 $(wb $x); done ;;
  # s0w0: valA / valB 8 windows (16384 tokens) and 4 retrieval trials; eval.tokens 16 windows, 4 trials
  ev-s0)    for x in $XS; do t=$(tag $x)
              ev s0-A-q1s-$t $MQ q1s-$t $O/valA.tokens 16384 4 0 0
              ev s0-B-q1s-$t $MQ q1s-$t $O/valB.tokens 16384 4 0 0
              ev s0-E-q1s-$t $MQ q1s-$t $T/eval.tokens 32768 4 0 0; done ;;
  ev-s0t2)  for x in $XS; do t=$(tag $x)
              ev s0-A-q2s-$t $MQ q2s-$t $O/valA.tokens 16384 4 0 0
              ev s0-B-q2s-$t $MQ q2s-$t $O/valB.tokens 16384 4 0 0; done ;;
  # text 2's s0w0 2-bit file with text 1's first two picks (6:1 K, 4:1 K) in 3 bits, unclipped, by fake-quant
  # (--storage; bit for bit what a format_version 4 file with those code widths stores, tests/test_eval_storage.c)
  ev-s0t2x) for sl in A B E; do tk=$O/val$sl.tokens; n=16384; [ $sl = E ] && { tk=$T/eval.tokens; n=32768; }
              ev s0-$sl-q2s-x61k41k $MQ q2s-2b $tk $n 4 0 0 --storage bits=3,kv=k,heads=6:1+4:1,clip=1; done ;;
  ev-s0t2E) for x in $XS; do t=$(tag $x); ev s0-E-q2s-$t $MQ q2s-$t $T/eval.tokens 32768 4 0 0; done ;;
  # windows 64/256: eval.tokens as report.md (16 windows, 4 trials), then valA / valB (8 windows, 8 trials)
  ev-w)     for x in $XS; do t=$(tag $x); ev w-E-q1-$t $MQ q1-$t $T/eval.tokens 32768 4 64 256; done ;;
  ev-wv)    for x in $XS; do t=$(tag $x)
              ev w-A-q1-$t $MQ q1-$t $O/valA.tokens 16384 8 64 256
              ev w-B-q1-$t $MQ q1-$t $O/valB.tokens 16384 8 64 256; done ;;
  # windows 64/256, eval.tokens, 16 retrieval trials (15856 predictions) for the retrieval question
  ev-wr)    for x in $XS; do t=$(tag $x); ev wr-E-q1-$t $MQ q1-$t $T/eval.tokens 32768 16 64 256; done ;;
  # tiny-llama (held out, group 64 = head_dim): eval.tokens, 16 windows, 4 trials; kivi2 beside the 2-bit file
  ev-l)     for x in $XS; do t=$(tag $x); m=bf16,oscar2; [ $x = 0 ] && m=bf16,kivi2,oscar2
              METHODS=$m ev L-E-l-$t $ML l-$t $T/eval.tokens 32768 4 64 256; done ;;
  ev-ls0)   for x in $XS; do t=$(tag $x); m=bf16,oscar2; [ $x = 0 ] && m=bf16,quarot2,oscar2
              METHODS=$m ev L-s0-E-ls-$t $ML ls-$t $T/eval.tokens 32768 4 0 0; done ;;
  *) echo "unknown stage $st" >&2; exit 2 ;;
esac; done

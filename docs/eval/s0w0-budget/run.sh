#!/usr/bin/env bash
# Issue 16, s0w0 (no windows: every key and value quantized) with the calibration's code-width budget
# as it is now the default (thirty-third session, helper acc33). Files calibrated for that layout
# (`oscar-calibrate --sink 0 --recent 0`, as docs/EVAL.md's s0w0 steps) with the default budget
# (no --wide-bits: OSCAR_CALIB_WIDE_BITS_AUTO = 0.05 bits per element) and larger budgets, evaluated
# `oscar-eval --sink 0 --recent 0`. Parameter files and raw outputs go to $OUT (the files are 4.2 MB
# each, not committed; the reports are copied to raw/).
# Usage: docs/eval/s0w0-budget/run.sh BUILD_DIR [STAGE...]   (from the repository root)
#   stages: cal ev evv (default: all three)   XS="def 0.0625 0.1" picks the budgets (def = no --wide-bits)
#   TEXTS="1 2" picks the calibration texts
# The invocations of the thirty-third session (OUT=/tmp/h33out/s0, SHARED=/work/shared, BUILD_DIR /tmp/h33b):
#   XS=def run.sh /tmp/h33b cal ev;  XS=def run.sh /tmp/h33b evv;  XS="0.0625 0.1" run.sh /tmp/h33b cal ev evv
#   docs/eval/s0w0-budget/tables.sh $OUT > docs/eval/s0w0-budget/raw/tables.md
set -euo pipefail
B=${1:-build}/bin; shift || true
S=${SHARED:-../shared}
T=$S/data/tiny-qwen3
MQ=$S/models/tiny-qwen3
O=${OUT:-/tmp/s0w0-budget}
XS=${XS:-"def 0.0625 0.1"}
TEXTS=${TEXTS:-"1 2"}
mkdir -p "$O"
# slices of calib.tokens (uint32) as docs/eval/wide-s0w0/run.sh: text 2 = [196608, 262144),
# valA from 131072, valB from 327680 (text 1 = [0, 65536), what oscar-calibrate reads by default)
[ -f "$O/calib2.tokens" ] || dd if=$T/calib.tokens of=$O/calib2.tokens bs=4 skip=196608 count=65536 status=none
[ -f "$O/valA.tokens" ] || dd if=$T/calib.tokens of=$O/valA.tokens bs=4 skip=131072 status=none
[ -f "$O/valB.tokens" ] || dd if=$T/calib.tokens of=$O/valB.tokens bs=4 skip=327680 status=none
text() { [ "$1" = 1 ] && echo "$T/calib.tokens" || echo "$O/calib2.tokens"; }
tag() { [ "$1" = def ] && echo def || echo "w${1#0.}"; }   # def, 0.0625 -> w0625, 0.1 -> w1
wb() { [ "$1" = def ] || echo "--wide-bits $1"; }
cal() { # name tokens [options]
  /usr/bin/time -f "%e s wall, %U s user" -o "$O/$1.time" \
    "$B/oscar-calibrate" "$MQ" --tokens "$2" --threads 2 --out "$O/$1.safetensors" "${@:3}" > "$O/$1.txt" 2> "$O/$1.err"; }
ev() { # name params tokens max-tokens trials [more options]
  /usr/bin/time -f "%e s wall, %U s user" -o "$O/$1.time" \
    "$B/oscar-eval" "$MQ" --params "$O/$2.safetensors" --tokens "$3" --methods "${METHODS:-bf16,oscar2}" \
    --context 2048 --max-tokens "$4" --retrieval-trials "$5" --sink 0 --recent 0 --threads 2 \
    --out "$O/$1.json" --md "$O/$1.md" "${@:6}" 2> "$O/$1.err"; }
stages=${*:-cal ev evv}
for st in $stages; do case $st in
  cal) for x in $XS; do for t in $TEXTS; do cal q${t}s-$(tag $x) "$(text $t)" --sink 0 --recent 0 $(wb $x); done; done ;;
  # eval.tokens: 16 windows (32768 tokens), 4 retrieval trials (report.md's protocol)
  ev)  for x in $XS; do for t in $TEXTS; do ev E-q${t}s-$(tag $x) q${t}s-$(tag $x) $T/eval.tokens 32768 4; done; done ;;
  # the validation slices: 8 windows (16384 tokens), 4 trials
  evv) for x in $XS; do for t in $TEXTS; do for sl in A B; do
         ev $sl-q${t}s-$(tag $x) q${t}s-$(tag $x) $O/val$sl.tokens 16384 4; done; done; done ;;
  *) echo "unknown stage $st" >&2; exit 2 ;;
esac; done

#!/usr/bin/env bash
# Issue 16, retrieval on eval.tokens (thirty-third session, helper acc33): the committed default parameter
# file (docs/eval/tiny-qwen3.oscar.safetensors, the code-width default, 2.281 bits/elt) against BF16 with
# 32 retrieval trials instead of report.md's 4, and the spread of the difference over the trials.
# oscar-eval's report.json now carries, per variant, retrieval_correct_per_trial (in trial order: the
# first 4 trials are report.md's) and retrieval_minus_reference_se (paired over the trials).
# Usage: docs/eval/retrieval-spread/run.sh BUILD_DIR   (from the repository root; about 2.5 minutes on the
# idle 2-core machine)
set -euo pipefail
B=${1:-build}/bin
S=${SHARED:-../shared}
O=${OUT:-docs/eval/retrieval-spread/raw}
mkdir -p "$O"
"$B/oscar-eval" $S/models/tiny-qwen3 --params docs/eval/tiny-qwen3.oscar.safetensors \
  --tokens $S/data/tiny-qwen3/eval.tokens --methods bf16,oscar2 --context 2048 --max-tokens 32768 \
  --sink 64 --recent 256 --retrieval-trials 32 --threads 2 \
  --out "$O/eval-default-t32.json" --md "$O/eval-default-t32.md" 2> "$O/eval-default-t32.log"
# per trial: bf16 and oscar2 correct predictions (991 per trial)
jq -r '[.methods.bf16.retrieval_correct_per_trial, .methods.oscar2.retrieval_correct_per_trial] | transpose[] | @tsv' \
  "$O/eval-default-t32.json" > "$O/pertrial.tsv"
# the first T trials: retrieval of each, the mean per-trial difference and its standard error
awk -v P=991 '{b[NR]=$1; o[NR]=$2} END {
  print "| trials | predictions | BF16 | oscar2 | oscar2 - BF16 | standard error | BF16 - 0.01 met |"
  print "|---|---|---|---|---|---|---|"
  for (T = 4; T <= NR; T *= 2) { sb = so = s = s2 = 0
    for (i = 1; i <= T; i++) { sb += b[i]; so += o[i]; d = (o[i] - b[i]) / P; s += d; s2 += d * d }
    m = s / T; se = sqrt((s2 - T * m * m) / (T - 1) / T)
    printf "| %d | %d | %.4f | %.4f | %+.4f | %.4f | %s |\n", T, T * P, sb / (T * P), so / (T * P), m, se, (m >= -0.01 ? "yes" : "no") } }' \
  "$O/pertrial.tsv" > "$O/spread.md"

#!/usr/bin/env bash
# The tables of README.md from run.sh's reports: docs/eval/s0w0-budget/tables.sh OUT > raw/tables.md
# (jq). One row per (budget, calibration text): bits/elt, the widened head-tensors (from the calibration
# output's ranking), then KL / delta ppl (% of BF16) / top-1 / retrieval on valA, valB and eval.tokens.
set -euo pipefail
O=${1:-/tmp/s0w0-budget}
XS=${XS:-"def 0.0625 0.1"}
tag() { [ "$1" = def ] && echo def || echo "w${1#0.}"; }
cell() { # report.json -> "KL / +d % / top-1 / retrieval"
  [ -f "$1" ] || { echo "-"; return; }
  jq -r '.methods | [.oscar2.kl, (.oscar2.ppl / .bf16.ppl - 1) * 100, .oscar2.top1, .oscar2.retrieval] | @tsv' "$1" |
    awk -F'\t' '{printf "%.4f / %+.1f %% / %.3f / %.3f", $1, $2, $3, $4}'; }
echo "| budget | text | bits/elt | 3-bit head-tensors (L:H K/V) | valA | valB | eval.tokens |"
echo "|---|---|---|---|---|---|---|"
for x in $XS; do for t in 1 2; do
  n=q${t}s-$(tag $x)
  [ -f "$O/E-$n.json" ] || continue
  bits=$(jq -r '.methods.oscar2.bits_per_element' "$O/E-$n.json")
  wide=$(awk '/^rank \|/ {on = 1; next} on && /^\(/ {on = 0} on && $NF == 3 {printf "%s%s:%s %s", s, $3, $4, $5; s = ", "}' "$O/$n.txt")
  echo "| $x | $t | $bits | $wide | $(cell "$O/A-$n.json") | $(cell "$O/B-$n.json") | $(cell "$O/E-$n.json") |"
done; done
echo
echo "BF16 retrieval (4 trials): valA $(jq -r '.methods.bf16.retrieval * 1000 | round / 1000' "$O/A-q1s-def.json"), valB $(jq -r '.methods.bf16.retrieval * 1000 | round / 1000' "$O/B-q1s-def.json"), eval.tokens $(jq -r '.methods.bf16.retrieval * 1000 | round / 1000' "$O/E-q1s-def.json")"

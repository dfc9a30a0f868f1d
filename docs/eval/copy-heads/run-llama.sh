#!/usr/bin/env bash
# Twenty-fourth session (helper acc24): the copy-head rule on the held-out tiny-llama
# (docs/eval/tiny-llama/): which heads --copy-heads 0.1 names there, and what the copy-head file
# does against the default file of the same calibration (eval.tokens, 4 windows).
# Usage (repository root): docs/eval/copy-heads/run-llama.sh [BUILD_DIR] [MODEL_DIR]
set -euo pipefail
B=${1:-build}/bin
M=${2:-/work/models-local/tiny-llama}
S=${SHARED:-/work/shared}
T=${TMPDIR:-/tmp}/acc24
O=docs/eval/copy-heads/raw
mkdir -p "$T" "$O"
CAL="nice -n 10 $B/oscar-calibrate $M --tokens $S/data/tiny-qwen3/calib.tokens --threads 2"
$CAL --out "$T/llama-def.safetensors" > "$T/cal-llama-def.log"
$CAL --copy-heads 0.1 --out "$T/llama-ch.safetensors" > "$T/cal-llama-ch.log"
sed -n '/^copy heads/,/copy head(s) named/p' "$T/cal-llama-ch.log" > "$O/copy-heads-tiny-llama.txt"
$B/oscar-inspect "$T/llama-def.safetensors" | tail -n +2 > "$T/i-llama-def.txt"
$B/oscar-inspect "$T/llama-ch.safetensors" | tail -n +2 > "$T/i-llama-ch.txt"
if cmp -s "$T/llama-def.safetensors" "$T/llama-ch.safetensors"; then
  echo "tiny-llama: the copy-head file is the default file byte for byte (cmp)" | tee -a "$O/copy-heads-tiny-llama.txt"
elif cmp -s "$T/i-llama-def.txt" "$T/i-llama-ch.txt"; then
  echo "tiny-llama: the copy-head file has the default file's rotations, clips and weights (oscar-inspect)" \
    | tee -a "$O/copy-heads-tiny-llama.txt"
else
  diff "$T/i-llama-def.txt" "$T/i-llama-ch.txt" | tee -a "$O/copy-heads-tiny-llama.txt" || true
  H=$(awk '/^copy heads/{on=1} on && $NF=="yes"{printf "%s%s:%s", (n++ ? "+" : ""), $1, $2}' "$T/cal-llama-ch.log")
  nice -n 10 $B/oscar-eval "$M" --params "$T/llama-def.safetensors" --tokens "$S/data/tiny-qwen3/eval.tokens" \
      --methods bf16,oscar2 --context 2048 --max-tokens 8192 --sink 64 --recent 256 --retrieval-trials 4 \
      --threads 2 --storage clip=0.97,kv=k,heads=$H --out "$T/llama.json" --md "$O/tiny-llama.md"
fi

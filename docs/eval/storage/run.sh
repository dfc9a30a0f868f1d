#!/usr/bin/env bash
# The storage-route study of docs/eval/retrieval.md (fifth step): oscar-eval --storage on tiny-qwen3
# (valA, valB, eval.tokens; parameters of calibration texts 1 and 2) and tiny-llama (eval.tokens).
# Usage: docs/eval/storage/run.sh [BUILD_DIR] [OUT_DIR]   (from the repository root; ~90 min on 2 cores)
set -euo pipefail
B=${1:-build}; O=${2:-/tmp/oscar-storage}
. "$(dirname "$0")/slices.sh"
ev() { # ev PARAMS TOKENS TAG [args]
    local p=$1 t=$2 tag=$3; shift 3
    "$B/bin/oscar-eval" "$M" --params "$p" --tokens "$t" --methods bf16,oscar2 --context 2048 --sink 64 --recent 256 \
        --threads 2 --out "$O/$tag.json" --md "$O/$tag.md" "$@" 2> "$O/$tag.log"
}
C=4:1+3:0 # the copy heads (oscar-copy-probe): layer 4 KV head 1, layer 3 KV head 0
S1=(--storage out=1 --storage out=1,by=norm --storage out=2 --storage out=4 --storage out=1,kv=k
    --storage out=1,kv=k,by=norm --storage out=2,kv=k,heads=$C --storage out=4,kv=k,heads=$C --storage out=2,heads=$C
    --storage out=2,by=norm,kv=k,heads=$C --storage group=32,kv=k,heads=$C --storage group=64,heads=$C
    --storage group=32,heads=$C --storage group=64)
S2=(--storage clip=1,kv=k,heads=$C --storage clip=1,group=32,kv=k,heads=$C --storage clip=1,group=64,kv=k,heads=$C
    --storage clip=1,out=2,kv=k,heads=$C --storage clip=1,heads=$C --storage clip=1,group=64,heads=$C --storage clip=1
    --storage clip=1,group=64 --storage clip=1,kv=k --storage clip=1,group=64,kv=k)
S3=(--storage clip=1,group=32,kv=k,heads=$C --storage clip=1,group=64,kv=k,heads=$C --storage clip=1,kv=k,heads=$C
    --storage group=32,kv=k,heads=$C --storage out=2,kv=k,heads=$C --storage clip=1,group=32,heads=$C
    --storage clip=1,group=64 --storage out=1 --storage group=64)
S4=(--storage clip=1,group=32,kv=k,heads=$C --storage clip=1,group=64,kv=k,heads=$C --storage clip=1,kv=k,heads=$C
    --storage group=32,kv=k,heads=$C)
for s in valA valB; do
    ev "$P" "$O/$s.tokens" "outliers-groups-$s" --max-tokens 16384 --retrieval-trials 8 "${S1[@]}"
    ev "$P" "$O/$s.tokens" "unclipped-copy-heads-$s" --max-tokens 16384 --retrieval-trials 8 "${S2[@]}"
    ev "$O/text2.oscar.safetensors" "$O/$s.tokens" "text2-$s" --max-tokens 16384 --retrieval-trials 8 "${S4[@]}"
done
ev "$P" "$D/eval.tokens" eval-tokens --max-tokens 32768 --retrieval-trials 4 "${S3[@]}"
# held-out model (docs/eval/tiny-llama/README.md; head_dim 64, group 64 = 2.5 bits/elt); it does not copy
L=${LLAMA:-/work/models-local/tiny-llama}
"$B/bin/oscar-eval" "$L" --params docs/eval/tiny-llama/tiny-llama.oscar.safetensors --tokens "$D/eval.tokens" \
    --methods bf16,oscar2 --context 2048 --max-tokens 16384 --sink 64 --recent 256 --threads 1 --retrieval-trials 4 \
    --storage out=1 --storage out=1,by=norm --storage out=1,kv=k --storage out=2,kv=k --storage group=32,kv=k \
    --storage clip=1 --storage clip=1,group=32 --out "$O/tiny-llama-eval.json" --md "$O/tiny-llama-eval.md" \
    2> "$O/tiny-llama-eval.log"
# the copy heads on calibration text (2 windows of calib.tokens from token 0)
"$B/bin/oscar-copy-probe" "$M" --tokens "$D/calib.tokens" --params "$P" --trials 2 --offset 0 --heads \
    > "$O/copy-probe-calib.txt" 2>&1
# without windows: a file calibrated for s0w0, groups only (out= needs a recent window)
"$B/bin/oscar-calibrate" "$M" --tokens "$D/calib.tokens" --sink 0 --recent 0 --threads 2 --out "$O/s0w0.oscar.safetensors" \
    > /dev/null 2>&1
"$B/bin/oscar-eval" "$M" --params "$O/s0w0.oscar.safetensors" --tokens "$D/eval.tokens" --methods bf16,oscar2 --context 2048 \
    --max-tokens 32768 --sink 0 --recent 0 --threads 2 --retrieval-trials 0 --storage clip=1,group=32,kv=k,heads=$C \
    --storage group=32,kv=k,heads=$C --storage group=32,heads=$C --storage group=64 --storage clip=1,group=64 \
    --out "$O/s0w0-eval-tokens.json" --md "$O/s0w0-eval-tokens.md" 2> "$O/s0w0-eval-tokens.log"

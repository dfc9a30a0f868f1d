#!/usr/bin/env bash
# The sixth step of docs/eval/retrieval.md: the copy heads' values (vclip=/vgroup=) and per-head
# clauses ('/') with oscar-eval --storage on tiny-qwen3 (valA, valB, eval.tokens; parameters of
# calibration texts 1 and 2), the copy probe on eval.tokens and calibration text 2, and s0w0.
# Usage: docs/eval/storage/run6.sh [BUILD_DIR] [OUT_DIR]   (from the repository root; ~90 min on 2 cores)
set -euo pipefail
B=${1:-build}; O=${2:-/tmp/oscar-storage6}
. "$(dirname "$0")/slices.sh"
ev() { # ev PARAMS TOKENS TAG SINK RECENT [args]
    local p=$1 t=$2 tag=$3 s0=$4 w=$5; shift 5
    "$B/bin/oscar-eval" "$M" --params "$p" --tokens "$t" --methods bf16,oscar2 --context 2048 --sink "$s0" --recent "$w" \
        --threads 2 --out "$O/$tag.json" --md "$O/$tag.md" "$@" 2> "$O/$tag.log"
}
C=4:1+3:0 # the copy heads (oscar-copy-probe): layer 4 KV head 1, layer 3 KV head 0
K=clip=1,group=32,kv=k,heads=$C                                       # fifth step: their keys unclipped, groups of 32
A=$K,vclip=1                                                          # + their values unclipped (group 128)
V1="$K/clip=1,group=32,kv=k,vclip=1,heads=4:1"                        # + layer 4's values only unclipped
V2="clip=1,group=32,kv=k,heads=4:1,vclip=1,vgroup=64/clip=1,group=64,kv=k,heads=3:0"
V3=clip=1,group=32,heads=4:1                                          # layer 4's keys and values, groups of 32
# the copy probe: eval.tokens (4 windows from token 0) and calibration text 2 (4 windows from 196608)
"$B/bin/oscar-copy-probe" "$M" --tokens "$D/eval.tokens" --params "$P" --trials 4 --offset 0 --heads > "$O/copy-probe-eval.txt" 2>&1
"$B/bin/oscar-copy-probe" "$M" --tokens "$D/calib.tokens" --params "$P" --trials 4 --offset 196608 --heads \
    > "$O/copy-probe-calib2.txt" 2>&1
# eval.tokens, the report's protocol (32768 tokens, 4 retrieval trials)
ev "$P" "$D/eval.tokens" eval-values 64 256 --max-tokens 32768 --retrieval-trials 4 --storage "$A" --storage "$K,vclip=0.9" \
    --storage clip=1,group=64,kv=k,heads=$C,vgroup=64 --storage clip=1,group=64,heads=$C \
    --storage clip=1,group=32,heads=$C,vclip=0.95 --storage group=32,kv=v,heads=$C
ev "$P" "$D/eval.tokens" eval-values2 64 256 --max-tokens 32768 --retrieval-trials 4 --storage "$K,vclip=0.98" \
    --storage "$K,vclip=0.99" --storage clip=1,group=32,kv=k,heads=4:1,vclip=1 --storage "$A,vgroup=64"
ev "$P" "$D/eval.tokens" eval-clauses 64 256 --max-tokens 32768 --retrieval-trials 4 --storage "$V1" --storage "$V2" \
    --storage "$V3" --storage "$A"
# eval.tokens retrieval with 16 trials (one scored window: its KL is not used)
ev "$P" "$D/eval.tokens" eval-retrieval16 64 256 --max-tokens 2048 --retrieval-trials 16 --storage "$K" --storage "$A" \
    --storage "$V1" --storage "$V2" --storage "$V3"
# where eval.tokens' KL sits (diagnosis: out=63 keeps 63 of 64 rows bf16), and K re-run
ev "$P" "$D/eval.tokens" eval-diagnosis 64 256 --max-tokens 32768 --retrieval-trials 4 --storage "$K" --storage "out=63/$A" \
    --storage out=63,heads=$C --storage out=63,kv=k,heads=$C --storage out=63,kv=v,heads=$C
ev "$P" "$D/eval.tokens" eval-diagnosis2 64 256 --max-tokens 32768 --retrieval-trials 4 --storage out=63,kv=k,heads=4:1 \
    --storage out=63,kv=k,heads=3:0 --storage "clip=1,group=32,kv=k,heads=4:1,vclip=1,out=1/clip=1,group=64,kv=k,heads=3:0,vclip=1" \
    --storage "clip=1,group=32,kv=k,heads=4:1,vclip=1/clip=1,group=64,kv=k,heads=3:0,vclip=1"
# valA, valB (16384 tokens, 8 retrieval trials), calibration texts 1 and 2
for s in valA valB; do
    ev "$P" "$O/$s.tokens" "values-$s" 64 256 --max-tokens 16384 --retrieval-trials 8 --storage "$A" --storage "$K,vclip=0.98" \
        --storage "$K,vclip=0.99" --storage "$K"
    ev "$P" "$O/$s.tokens" "clauses-$s" 64 256 --max-tokens 16384 --retrieval-trials 8 --storage "$V1" --storage "$V2" --storage "$V3"
    ev "$O/text2.oscar.safetensors" "$O/$s.tokens" "text2-$s" 64 256 --max-tokens 16384 --retrieval-trials 8 --storage "$K" \
        --storage "$A" --storage "$V1" --storage "$V2" --storage "$V3"
done
# without windows (s0w0): the file calibrated for it; no retrieval trials
"$B/bin/oscar-calibrate" "$M" --tokens "$D/calib.tokens" --sink 0 --recent 0 --threads 2 --out "$O/s0w0.oscar.safetensors" \
    > /dev/null 2>&1
Z=$O/s0w0.oscar.safetensors
for s in valA valB; do
    ev "$Z" "$O/$s.tokens" "s0w0-$s" 0 0 --max-tokens 16384 --retrieval-trials 0 --storage "$K" --storage "$A"
    ev "$Z" "$O/$s.tokens" "s0w0-values-$s" 0 0 --max-tokens 16384 --retrieval-trials 0 --storage vclip=1 --storage "vclip=1/$K"
done
ev "$Z" "$D/eval.tokens" s0w0-eval 0 0 --max-tokens 32768 --retrieval-trials 0 --storage "$K" --storage "$A"
# s0w0 diagnosis on valA's first 4 windows: the first token bf16 (--sink 1), the current token bf16 (--recent 1),
# groups on layers 4 and 6 (which carry the most s0w0 KL per layer, EVAL.md)
ev "$Z" "$O/valA.tokens" s0w0-sink1-valA 1 0 --max-tokens 8192 --retrieval-trials 0
ev "$Z" "$O/valA.tokens" s0w0-own-valA 0 1 --max-tokens 8192 --retrieval-trials 0
ev "$Z" "$O/valA.tokens" s0w0-layers-valA 0 0 --max-tokens 8192 --retrieval-trials 0 --storage group=32,kv=k,heads=4:0+4:1 \
    --storage group=32,kv=k,heads=6:0+6:1 --storage group=64,kv=k,heads=4:0+4:1+6:0+6:1 --storage "$A"

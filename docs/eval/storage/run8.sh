#!/usr/bin/env bash
# The eighth step of docs/eval/retrieval.md: layer 4 KV head 1's keys in 3 bits (oscar-eval --storage bits=3)
# on tiny-qwen3: valA, valB with calibration texts 1 and 2, then eval.tokens (confirmation only).
# One core, one worker (the machine is shared): ~75 min in all on a quiet core.
# Usage: docs/eval/storage/run8.sh [BUILD_DIR] [OUT_DIR]   (from the repository root)
set -euo pipefail
B=${1:-build}; O=${2:-/tmp/oscar-storage8}
. "$(dirname "$0")/slices.sh" # valA, valB, calib2.tokens (and a text-2 file calibrated with --threads 2)
# text 2's file of this step: calibrated on one thread
taskset -c 1 "$B/bin/oscar-calibrate" "$M" --tokens "$O/calib2.tokens" --threads 1 --out "$O/text2.oscar.safetensors" \
    > "$O/calib2.log" 2>&1
ev() { # ev PARAMS TOKENS TAG [args]
    local p=$1 t=$2 tag=$3; shift 3
    taskset -c 1 "$B/bin/oscar-eval" "$M" --params "$p" --tokens "$t" --methods bf16,oscar2 --context 2048 \
        --sink 64 --recent 256 --threads 1 --out "$O/$tag.json" --md "$O/$tag.md" "$@" 2> "$O/$tag.log"
}
S1=bits=3,kv=k,heads=4:1                 # 3b: layer 4 KV head 1's keys in 3 bits, the file's clip
S2=bits=3,kv=k,heads=4:1,clip=1          # 3b-u: the same, unclipped
S4=bits=3,kv=k,heads=4:1,clip=1,vclip=1  # 3b-uv: + that head's values unclipped (2 bits)
S3="bits=3,kv=k,clip=1,vclip=1,heads=4:1/clip=1,group=64,kv=k,vclip=1,heads=3:0" # 3b-uv+3:0: + layer 3 KV head 0 as V2
T2=$O/text2.oscar.safetensors
ev "$P" "$O/valA.tokens" t1-valA --max-tokens 16384 --retrieval-trials 8 --storage $S1 --storage $S2 --storage $S4 --storage "$S3"
ev "$P" "$O/valB.tokens" t1-valB --max-tokens 16384 --retrieval-trials 8 --storage $S1 --storage $S2 --storage $S4
ev "$T2" "$O/valA.tokens" t2-valA --max-tokens 8192 --retrieval-trials 8 --storage $S2
ev "$T2" "$O/valB.tokens" t2-valB --max-tokens 8192 --retrieval-trials 8 --storage $S2
ev "$P" "$D/eval.tokens" eval --max-tokens 32768 --retrieval-trials 4 --storage $S2 --storage $S4
ev "$P" "$D/eval.tokens" eval-ret16 --max-tokens 2048 --retrieval-trials 16 --storage $S2 --storage $S4

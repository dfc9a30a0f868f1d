#!/usr/bin/env bash
# Issue 16, helper acc23: which keys' clip loses retrieval (docs/eval/key-clip-ablation/README.md).
# Screening runs only (2 or 4 windows of 2048 per slice, 8 retrieval trials); every row is the same
# parameter file read with other clips (oscar-eval --storage clip=C,kv=k,heads=...), nothing rebuilt.
# Usage (repository root, CPU build in build/): docs/eval/key-clip-ablation/run.sh
set -euo pipefail
S=${SHARED:-/work/shared}
M=$S/models/tiny-qwen3
T=${TMPDIR:-/tmp}/key-clip-ablation
O=docs/eval/key-clip-ablation/raw
B=build/bin
mkdir -p "$T" "$O"
python3 - "$S/data/tiny-qwen3/calib.tokens" "$T" <<'EOF'
import sys
d = open(sys.argv[1], 'rb').read()
s = lambda a, b=None: d[4 * a:(4 * b if b else None)]
open(sys.argv[2] + '/valA.tokens', 'wb').write(s(131072))          # validation slice A
open(sys.argv[2] + '/valB.tokens', 'wb').write(s(327680))          # validation slice B
open(sys.argv[2] + '/calib2.tokens', 'wb').write(s(196608, 262144))  # calibration text 2
EOF
EV="nice -n 10 $B/oscar-eval $M --methods bf16,oscar2 --context 2048 --sink 64 --recent 256 --retrieval-trials 8 --threads 2"
# text 2 default file (text 1: the committed docs/eval/tiny-qwen3.oscar.safetensors)
nice -n 10 $B/oscar-calibrate $M --tokens $T/calib2.tokens --threads 1 --out $T/t2.safetensors > $T/cal-t2.log
# 1. one layer's keys unclipped at a time (+ single heads, all keys, all values), text 1, valA, 2 windows
S1=""; for L in 0 1 2 3 4 5 6 7; do S1="$S1 --storage clip=1,kv=k,heads=$L:0+$L:1"; done
for h in 3:0 3:1 4:0 4:1; do S1="$S1 --storage clip=1,kv=k,heads=$h"; done
$EV --params docs/eval/tiny-qwen3.oscar.safetensors --tokens $T/valA.tokens --max-tokens 4096 $S1 \
    --storage clip=1,kv=k,heads=all --storage clip=1,kv=v,heads=all --out $T/abl-t1-valA.json --md $O/abl-t1-valA.md
# 2. the copy head's (layer 4, KV head 1) key clip swept, text 1, valA and valB, 4 windows
for s in valA valB; do
  S2=""; for c in 0.96 0.97 0.98 0.99 1; do S2="$S2 --storage clip=$c,kv=k,heads=4:1"; done
  $EV --params docs/eval/tiny-qwen3.oscar.safetensors --tokens $T/$s.tokens --max-tokens 8192 $S2 \
      --out $T/sw41-t1-$s.json --md $O/sw41-t1-$s.md
done
# 3. text 2: per-layer ablation and the sweep, valA and valB, 4 windows
for s in valA valB; do
  S3=""; for h in 0:0+0:1 1:0+1:1 2:0+2:1 3:0+3:1 4:0+4:1 5:0+5:1 6:0+6:1 7:0+7:1 3:0 4:0; do S3="$S3 --storage clip=1,kv=k,heads=$h"; done
  for c in 0.97 0.98 0.99 1; do S3="$S3 --storage clip=$c,kv=k,heads=4:1"; done
  $EV --params $T/t2.safetensors --tokens $T/$s.tokens --max-tokens 8192 $S3 --out $T/abl-t2-$s.json --md $O/abl-t2-$s.md
done
# 4. tiny-llama (held out, no copy head), eval.tokens, 4 windows, group 64
S4=""; for L in 0 1 2 3 4 5; do S4="$S4 --storage clip=1,kv=k,heads=$L:0+$L:1"; done
nice -n 10 $B/oscar-eval /work/models-local/tiny-llama --params docs/eval/tiny-llama/tiny-llama.oscar.safetensors \
    --tokens $S/data/tiny-qwen3/eval.tokens --methods bf16,oscar2 --context 2048 --max-tokens 8192 --sink 64 --recent 256 \
    --retrieval-trials 4 --threads 2 $S4 --storage clip=0.97,kv=k,heads=all --storage clip=1,kv=k,heads=all \
    --out $T/llama-abl.json --md $O/llama-abl.md
# 5. where text 2 loses retrieval: one layer (or one tensor) in 4-bit codes, unclipped (a diagnosis
#    by fake-quant, not a format), text 2, valA, 2 windows
S5=""; for L in 0 1 2 3 4 5 6 7; do S5="$S5 --storage bits=4,clip=1,kv=kv,heads=$L:0+$L:1"; done
$EV --params $T/t2.safetensors --tokens $T/valA.tokens --max-tokens 4096 $S5 \
    --storage bits=4,clip=1,kv=k,heads=4:1 --storage bits=4,clip=1,kv=v,heads=4:1 \
    --storage bits=4,clip=1,kv=k,heads=all --storage bits=4,clip=1,kv=v,heads=all \
    --out $T/where-t2-valA.json --md $O/where-t2-valA.md
# 6. the copy head's feedback ridge: layer 4 KV head 1's key feedback weights taken from a
#    --feedback-damp 0.01 / 0.1 calibration of the same text (same rotation), grafted into the
#    default file of this machine (graft.py), at the fitted clip, 0.97 and 1
cp docs/eval/key-clip-ablation/graft.py $T/
nice -n 10 $B/oscar-calibrate $M --tokens $S/data/tiny-qwen3/calib.tokens --threads 1 --out $T/t1.safetensors > $T/cal-t1.log
for r in 0.01 0.1; do
  nice -n 10 $B/oscar-calibrate $M --tokens $S/data/tiny-qwen3/calib.tokens --feedback-damp $r --threads 1 --out $T/t1-r$r.safetensors > $T/cal-t1-r$r.log
  python3 $T/graft.py $T/t1.safetensors $T/t1-r$r.safetensors $T/g41-r$r.safetensors layers.4.fb_k 1
done
nice -n 10 $B/oscar-calibrate $M --tokens $T/calib2.tokens --feedback-damp 0.1 --threads 1 --out $T/t2-r0.1.safetensors > $T/cal-t2-r0.1.log
python3 $T/graft.py $T/t2.safetensors $T/t2-r0.1.safetensors $T/g41t2-r0.1.safetensors layers.4.fb_k 1
for s in valA valB; do
  for f in t1 g41-r0.01 g41-r0.1 g41t2-r0.1; do
    $EV --params $T/$f.safetensors --tokens $T/$s.tokens --max-tokens 8192 \
        --storage clip=0.97,kv=k,heads=4:1 --storage clip=1,kv=k,heads=4:1 --out $T/rg-$f-$s.json --md $O/rg-$f-$s.md
  done
done
# 7. text 3 (added last): the copy head's key clip at 0.97 / 0.98 / 1
python3 -c "import sys; d=open('$S/data/tiny-qwen3/calib.tokens','rb').read(); open('$T/calib3.tokens','wb').write(d[4*262144:4*327680])"
nice -n 10 $B/oscar-calibrate $M --tokens $T/calib3.tokens --threads 2 --out $T/t3.safetensors > $T/cal-t3.log
for s in valA valB; do
  $EV --params $T/t3.safetensors --tokens $T/$s.tokens --max-tokens 8192 --storage clip=0.97,kv=k,heads=4:1 \
      --storage clip=0.98,kv=k,heads=4:1 --storage clip=1,kv=k,heads=4:1 --out $T/sw41-t3-$s.json --md $O/sw41-t3-$s.md
done

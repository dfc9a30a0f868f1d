#!/bin/bash
# usage: ev.sh PARAMS SLICE [WINDOWS] [TRIALS]  -> PARAMS.SLICE.md
B=/work/wt-acc25/build/bin
M=/work/shared/models/tiny-qwen3
W=${3:-8}; T=${4:-8}
/usr/bin/time -f "%e s wall %U s user" nice $B/oscar-eval $M --params /tmp/acc25/$1.safetensors --tokens /tmp/acc25/$2.tokens \
  --methods bf16,oscar2 --context 2048 --max-tokens $((W*2048)) --sink 64 --recent 256 --retrieval-trials $T --threads 2 \
  --out /tmp/acc25/$1.$2.json --md /tmp/acc25/$1.$2.md > /tmp/acc25/$1.$2.log 2>&1
grep -E "^\| (bf16|oscar2) " /tmp/acc25/$1.$2.md | sed "s/^/$1 $2 /"

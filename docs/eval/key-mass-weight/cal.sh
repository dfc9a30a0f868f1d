#!/bin/bash
# usage: cal.sh TEXT VMIX NAME
B=/work/wt-acc25/build/bin
M=/work/shared/models/tiny-qwen3
OSCAR_EXP_VMIX=$2 OSCAR_EXP_KPOW=${KPOW:-2} /usr/bin/time -f "%e s wall %U s user" nice $B/oscar-calibrate $M --tokens /tmp/acc25/$1.tokens --out /tmp/acc25/$3.safetensors > /tmp/acc25/$3.cal.txt 2> /tmp/acc25/$3.cal.err

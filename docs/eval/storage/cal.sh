#!/bin/bash
# calibrations for the ninth step, sequential, logs in /tmp/acc10
B=/work/wt-acc10/build/bin
S=/work/shared
cd /tmp/acc10
/usr/bin/time -f "%e s wall %U s user" $B/oscar-calibrate $S/models/tiny-qwen3 --tokens $S/data/tiny-qwen3/calib.tokens --wide-bits 0.05 --threads 2 --out q1w.safetensors > q1w.txt 2>q1w.err
/usr/bin/time -f "%e s wall %U s user" $B/oscar-calibrate $S/models/tiny-qwen3 --tokens calib2.tokens --wide-bits 0.05 --threads 2 --out q2w.safetensors > q2w.txt 2>q2w.err
/usr/bin/time -f "%e s wall %U s user" $B/oscar-calibrate /work/models-local/tiny-llama-t --tokens $S/data/tiny-qwen3/calib.tokens --wide-bits 0.05 --threads 2 --out lw.safetensors > lw.txt 2>lw.err
echo ALLDONE

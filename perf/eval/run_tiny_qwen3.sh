#!/bin/sh
# Default accuracy evaluation of tiny-qwen3 (docs/EVAL.md): calibrate (uniform
# and Lloyd-Max levels) on calib.tokens, evaluate every method + ablations on
# eval.tokens, write docs/eval/report.{json,md} and plot.png. Each step is
# timed (wall and CPU). Usage: perf/eval/run_tiny_qwen3.sh [BUILD_DIR] [OUT_DIR]
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-eval}
OUT=${2:-$ROOT/docs/eval}
SHARED=${OSCAR_SHARED_DIR:-$ROOT/../shared}
MODEL=$SHARED/models/tiny-qwen3
DATA=$SHARED/data/tiny-qwen3
WORK=${TMPDIR:-/tmp}/oscar-eval-tiny-qwen3
mkdir -p "$WORK" "$OUT"
cmake --build "$BUILD" -j2 --target oscar-eval oscar-calibrate >/dev/null
T=/usr/bin/time
# Library defaults: one rotation per KV head, m-sequence placement, error-feedback rounding, probe-fitted
# clips (docs/eval/feedback.md: --clip-search ties them on validation text), the code-width budget (0.05 bits
# per element: one 3-bit head-tensor in the uniform file; none with --lloyd-max). The two files are
# docs/eval/tiny-qwen3.oscar*.safetensors: copy them there when the report is kept.
$T -f "calibrate (uniform): %e s wall, %U s user" "$BUILD/bin/oscar-calibrate" "$MODEL" \
    --tokens "$DATA/calib.tokens" --out "$WORK/tiny-qwen3.oscar.safetensors" > "$WORK/calib.log" 2>&1
$T -f "calibrate (Lloyd-Max): %e s wall, %U s user" "$BUILD/bin/oscar-calibrate" "$MODEL" \
    --tokens "$DATA/calib.tokens" --lloyd-max --out "$WORK/tiny-qwen3.oscar-lm.safetensors" > "$WORK/calib_lm.log" 2>&1
tail -n 2 "$WORK/calib.log" "$WORK/calib_lm.log"
$T -f "evaluate: %e s wall, %U s user" "$BUILD/bin/oscar-eval" "$MODEL" \
    --params "$WORK/tiny-qwen3.oscar.safetensors" --params-lm "$WORK/tiny-qwen3.oscar-lm.safetensors" \
    --tokens "$DATA/eval.tokens" --methods bf16,int4,int2,quarot2,kivi2,oscar2,oscar2-lm \
    --context 2048 --max-tokens 32768 --sink 64 --recent 256 --ablations --threads 2 \
    --out "$OUT/report.json" --md "$OUT/report.md" --plot "$OUT/plot.png"
cat "$OUT/report.md"

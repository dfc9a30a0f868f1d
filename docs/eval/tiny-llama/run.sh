#!/usr/bin/env bash
# Calibrate and evaluate the Llama-layout model trained by train.py (docs/eval/tiny-llama/README.md).
# Usage: docs/eval/tiny-llama/run.sh [MODEL_DIR] [BUILD_DIR]   (from the repository root)
set -euo pipefail
M=${1:-/work/models-local/tiny-llama}
B=${2:-build}
S=${SHARED:-../shared}
O=docs/eval/tiny-llama
T=$S/data/tiny-qwen3
/usr/bin/time -f "calibration: %e s wall, %U s user CPU" "$B/bin/oscar-calibrate" "$M" --tokens "$T/calib.tokens" \
    --threads 2 --out "$O/tiny-llama.oscar.safetensors" > "$O/calibration.txt" 2> "${TMPDIR:-/tmp}/tiny-llama-calibration.err"
tail -1 "${TMPDIR:-/tmp}/tiny-llama-calibration.err"
"$B/bin/oscar-eval" "$M" --params "$O/tiny-llama.oscar.safetensors" --tokens "$T/eval.tokens" \
    --methods bf16,int4,int2,quarot2,kivi2,oscar2 --context 2048 --max-tokens 32768 --sink 64 --recent 256 \
    --ablations --threads 2 --out "$O/report.json" --md "$O/report.md" 2> "${TMPDIR:-/tmp}/tiny-llama-eval.err"
tail -1 "${TMPDIR:-/tmp}/tiny-llama-eval.err"

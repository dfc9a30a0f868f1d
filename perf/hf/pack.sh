#!/usr/bin/env bash
# Packs what perf/hf/run.sh needs on the device machine (no network, no
# ../shared there): perf/e2e/pack.sh's folder (tiny-qwen3, the first 64K eval
# tokens, the GPU engine's host libraries; ~54 MB) plus wheels/ with the
# optimum-quanto wheel (pure Python, ~165 KB) for transformers' QuantizedCache.
# hqq, QuantizedCache's other backend, is published as a source archive only:
# not carried. Usage: perf/hf/pack.sh [SHARED_DIR] [OUT_DIR] (defaults
# ../shared, .devcarry/e2e).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
outdir=${2:-$root/.devcarry/e2e}
bash "$root/perf/e2e/pack.sh" "${1:-$root/../shared}" "$outdir"
mkdir -p "$outdir/wheels"
python3 -m pip download -q --no-deps --only-binary=:all: -d "$outdir/wheels" optimum-quanto==0.2.7
du -sh "$outdir" "$outdir"/wheels/*

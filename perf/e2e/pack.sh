#!/usr/bin/env bash
# Packs what perf/e2e/run.sh needs on the device machine (no package
# registry, no ../shared there) into one folder to carry, small enough for
# the 64 MiB carry limit together with the working tree:
#   deps.tar.xz       host libraries liboscar's build needs beyond the CUDA
#                     image (jansson, LAPACK/LAPACKE, OpenBLAS, gfortran
#                     runtime) with headers, from this Debian 12 machine (~8 MB)
#   tiny-qwen3.tar.xz the model (~46 MB instead of 61 MiB)
#   eval-head.tokens  the first 65536 tokens of eval.tokens (256 KB)
#   calib-head.tokens the first 65536 tokens of calib.tokens (256 KB): run.sh calibrates the
#                     --wide-bits 0.05 parameter file of its wide-pages checks from them (CPU)
# Usage: perf/e2e/pack.sh [SHARED_DIR] [OUT_DIR]   (defaults ../shared, .devcarry/e2e)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
shared=${1:-$root/../shared}
outdir=${2:-$root/.devcarry/e2e}
out=$outdir/deps.tar.xz
L=/usr/lib/x86_64-linux-gnu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lib/pkgconfig" "$tmp/include"
cp -L $L/libjansson.so.4 "$tmp/lib/"
cp -L $L/liblapacke.so.3 $L/libtmglib.so.3 $L/libgfortran.so.5 "$tmp/lib/"
cp -L $L/openblas-pthread/liblapack.so.3 $L/openblas-pthread/libblas.so.3 "$tmp/lib/"
cp -L "$(readlink -f $L/libopenblas.so.0)" "$tmp/lib/libopenblas.so.0"
cp -L $L/libquadmath.so.0 "$tmp/lib/" 2>/dev/null || true
(cd "$tmp/lib" && ln -s libjansson.so.4 libjansson.so && ln -s liblapacke.so.3 liblapacke.so &&
 ln -s liblapack.so.3 liblapack.so && ln -s libblas.so.3 libblas.so && ln -s libopenblas.so.0 libopenblas.so &&
 ln -s libtmglib.so.3 libtmglib.so)
cp /usr/include/jansson.h /usr/include/jansson_config.h /usr/include/lapack.h /usr/include/lapacke*.h "$tmp/include/"
cp /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h \
   /usr/include/x86_64-linux-gnu/openblas-pthread/openblas_config.h "$tmp/include/"
cat >"$tmp/lib/pkgconfig/jansson.pc" <<'PC'
prefix=/tmp/e2e-deps
libdir=${prefix}/lib
includedir=${prefix}/include
Name: Jansson
Description: Library for encoding, decoding and manipulating JSON data
Version: 2.14
Libs: -L${libdir} -ljansson
Cflags: -I${includedir}
PC
mkdir -p "$(dirname "$out")"
tar -C "$tmp" -cJf "$out" .
echo "wrote $out ($(du -h "$out" | cut -f1))"
tar -C "$shared/models" -cJf "$outdir/tiny-qwen3.tar.xz" tiny-qwen3
head -c 262144 "$shared/data/tiny-qwen3/eval.tokens" >"$outdir/eval-head.tokens"
head -c 262144 "$shared/data/tiny-qwen3/calib.tokens" >"$outdir/calib-head.tokens"
du -sh "$outdir"/*

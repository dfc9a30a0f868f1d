#!/bin/sh
# oscar-eval must refuse bad input with a clear message and exit status 2.
# Usage: perf/eval/check_bad_input.sh [BUILD_DIR]
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-eval}
SHARED=${OSCAR_SHARED_DIR:-$ROOT/../shared}
E=$BUILD/bin/oscar-eval
M=$SHARED/models/tiny-qwen3
TK=$SHARED/data/tiny-qwen3/eval.tokens
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
# Parameters of another shape (4 layers instead of 8), a 100-token file.
cat > "$W/mk.c" <<'C'
#include "oscar/oscar.h"
int main(int argc, char **argv) {
    oscar_params *p;
    (void)argc;
    if (oscar_params_create_builtin(OSCAR_METHOD_OSCAR2, 4, 8, 2, 128, &p)) return 1;
    return oscar_params_save(p, argv[1]) != 0;
}
C
# Sanitizer flags either way: harmless on a plain build, needed on an ASan one.
cc -fsanitize=address,undefined -I"$ROOT/include" "$W/mk.c" -o "$W/mk" "$BUILD/lib/liboscar_core.a" \
    -ljansson -llapacke -lopenblas -lm -ldl -lpthread && "$W/mk" "$W/other.safetensors"
if [ ! -s "$W/other.safetensors" ]; then echo "FAIL: could not make the wrong-shape parameter file"; exit 1; fi
python3 -c "import struct,sys; open(sys.argv[1],'wb').write(struct.pack('<100I',*range(100)))" "$W/short.tokens"
fail=0
check() {
    desc=$1; shift
    out=$("$E" "$@" --out "$W/r.json" 2>&1); rc=$?
    if [ $rc -eq 2 ]; then echo "ok   ($desc): $out"; else echo "FAIL ($desc): exit $rc: $out"; fail=1; fi
}
check "params of another model" "$M" --tokens "$TK" --params "$W/other.safetensors"
check "context > max_position_embeddings" "$M" --tokens "$TK" --methods int2 --context 8192
check "too few tokens for one window" "$M" --tokens "$W/short.tokens" --methods int2
check "unknown method" "$M" --tokens "$TK" --methods bf16,int3
check "oscar2 without --params" "$M" --tokens "$TK" --methods oscar2
check "unsupported group" "$M" --tokens "$TK" --methods int2 --group 48
check "missing model" /nonexistent --tokens "$TK" --methods int2
exit $fail

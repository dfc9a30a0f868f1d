#!/usr/bin/env bash
# Installs the build to a prefix, moves the prefix (relocatable), then builds
# and runs out-of-tree consumers against it: the README's C example and a
# calibration program, once through find_package(oscar CONFIG) and once
# through pkg-config. Also checks what the installed files depend on.
# Usage: check_install.sh BUILD_DIR SOURCE_DIR LIBDIR [EXTRA_CFLAGS]
set -euo pipefail
build=$(cd "$1" && pwd); src=$(cd "$2" && pwd); libdir=$3; cflags=${4:-}
work=$build/install-check
rm -rf "$work"; mkdir -p "$work"
fail() { echo "check_install: FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$work/first" > "$work/install.log"
mv "$work/first" "$work/prefix"          # every path must survive the move
P=$work/prefix; L=$P/$libdir
for f in include/oscar/oscar.h "$libdir/liboscar.so" "$libdir/liboscar.so.0" "$libdir/liboscar_calib.so.0" \
         "$libdir/cmake/oscar/oscarConfig.cmake" "$libdir/pkgconfig/oscar.pc" "$libdir/pkgconfig/oscar-calib.pc" \
         bin/oscar-bench bin/oscar-inspect share/doc/liboscar/README.md share/doc/liboscar/API.md; do
  [ -e "$P/$f" ] || fail "$f not installed"
done
opencl=0
[ -e "$build/lib/liboscar_backend_opencl.so" ] && opencl=1
if ((opencl)); then [ -e "$L/oscar/liboscar_backend_opencl.so" ] || fail "OpenCL plugin not in $libdir/oscar"; fi

# liboscar.so serves with libc only (sanitizer runtimes aside).
[ "$(readelf -d "$L/liboscar.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')" = liboscar.so.0 ] || fail "SONAME"
needed=$(readelf -d "$L/liboscar.so" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | tr '\n' ' ')
for n in $needed; do
  case $n in libc.so.*|libm.so.*|libdl.so.*|ld-linux*|libasan.so.*|libubsan.so.*) ;;
    *) fail "liboscar.so needs $n (only libc/libdl/libm allowed): $needed" ;; esac
done
echo "liboscar.so needs: $needed"
# The ABI only grows within a major version: every function of the record is
# still exported under its symbol version, and every one exported is recorded.
check_symbols() { # $1: library, $2: symbol version, $3: record
  local have want
  have=$(readelf --dyn-syms -W "$1" | awk -v v="@@$2" '$8 ~ v"$" {sub(v"$", "", $8); print $8}' | sort -u)
  want=$(grep -v '^#' "$3" | sort -u)
  local gone new
  gone=$(comm -13 <(echo "$have") <(echo "$want") | tr '\n' ' ')
  new=$(comm -23 <(echo "$have") <(echo "$want") | tr '\n' ' ')
  [ -z "${gone// }" ] || fail "$(basename "$1") no longer exports $gone under $2: a program linked against it would not load (docs/API.md \"Versions\": add, never remove or rename)"
  [ -z "${new// }" ] || fail "$(basename "$1") exports $new under $2 but $3 does not list it: add the name there"
}
check_symbols "$L/liboscar.so" OSCAR_0 "$src/tests/install/abi/liboscar.symbols"
check_symbols "$L/liboscar_calib.so.0" OSCAR_CALIB_0 "$src/tests/install/abi/liboscar_calib.symbols"
# No installed ELF may point into the build or source tree.
while IFS= read -r f; do
  rp=$(readelf -d "$f" 2>/dev/null | sed -n 's/.*R\(UN\)\?PATH.*\[\(.*\)\]/\2/p')
  case "$rp" in *"$build"*|*"$src"*) fail "$f has RUNPATH $rp (build tree)";; esac
done < <(find "$P" -type f \( -name '*.so*' -o -path '*/bin/*' \))
# grep -q reads here-strings, never a pipe: under pipefail a writer still writing when grep -q has
# matched and exited dies of SIGPIPE and fails the pipeline (seen once in a loaded ctest run).
grep -q 'R.*PATH.*\$ORIGIN' <<<"$(readelf -d "$P/bin/oscar-inspect")" || fail "oscar-inspect has no \$ORIGIN RUNPATH"

# The README's C example, exactly as written there.
awk '/<!-- test: README C example/{m=1;next} m&&/^```c/{p=1;next} p&&/^```/{exit} p' "$src/README.md" \
  > "$work/readme_example.c"
[ -s "$work/readme_example.c" ] || fail "no C example found in README.md"

unset OSCAR_PLUGIN_PATH OSCAR_BACKEND
run_pair() { # $1: example binary, $2: calib binary
  # Backend discovery probes every plugin: the HIP runtime (and PoCL's clang)
  # keep allocations LeakSanitizer cannot attribute once the plugin is
  # dlclose'd, so that run checks memory errors only; the cpu run below opens
  # no plugin and keeps the leak check on the library's own code.
  out=$(ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 "$1") || fail "$1 failed: $out"
  grep -q "bits per element" <<<"$out" || fail "$1 printed: $out"
  if ((opencl)); then
    grep -q "found:   $L/oscar/liboscar_backend_opencl.so" <<<"$out" ||
      fail "plugin not found beside the moved library: $out"
  fi
  local o
  o=$(OSCAR_BACKEND=cpu "$1") && grep -q "chosen: cpu" <<<"$o" || fail "$1 with OSCAR_BACKEND=cpu"
  o=$("$2") && grep -q calibrated <<<"$o" || fail "$2 failed"
}

cmake -S "$src/tests/install/consumer" -B "$work/cmake-consumer" -DCMAKE_PREFIX_PATH="$P" \
      -DOSCAR_EXAMPLE_SOURCE="$work/readme_example.c" -DCMAKE_C_FLAGS="$cflags" > "$work/consumer.log"
cmake --build "$work/cmake-consumer" >> "$work/consumer.log"
run_pair "$work/cmake-consumer/readme_example" "$work/cmake-consumer/calib_consumer"
# An engine's own pools, block tables and streams: the CPU run keeps the leak
# check; the OpenCL run (on its own cl_context) checks memory errors only, as above.
"$work/cmake-consumer/engine_consumer" --cpu-only || fail "engine_consumer (cpu) failed"
# and with the host-side validation on: a correct engine's batches pass it (no false alarm)
OSCAR_VALIDATE=1 "$work/cmake-consumer/engine_consumer" --cpu-only >/dev/null || fail "engine_consumer (cpu, OSCAR_VALIDATE=1) failed"
if ((opencl)); then
  ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 "$work/cmake-consumer/engine_consumer" --require-opencl ||
    fail "engine_consumer (cpu and opencl) failed"
fi
echo "CMake consumer: ok"

export PKG_CONFIG_PATH=$L/pkgconfig
# ${pcfiledir}-relative: the moved prefix's libdir, spelled through pkgconfig/../..
pc_libdir=$(cd "$(pkg-config --variable=libdir oscar)" && pwd)
[ "$pc_libdir" = "$L" ] || fail "pkg-config libdir $pc_libdir is not $L"
# shellcheck disable=SC2046,SC2086
cc -std=c11 $cflags "$work/readme_example.c" $(pkg-config --cflags --libs oscar) -Wl,-rpath,"$pc_libdir" \
   -o "$work/pc_example"
# shellcheck disable=SC2046,SC2086
cc -std=c11 $cflags "$src/tests/install/consumer/calib_consumer.c" $(pkg-config --cflags --libs oscar-calib) \
   -lm -Wl,-rpath,"$pc_libdir" -o "$work/pc_calib"
run_pair "$work/pc_example" "$work/pc_calib"
echo "pkg-config consumer: ok"

"$P/bin/oscar-inspect" "$src/docs/eval/tiny-qwen3.oscar.safetensors" > /dev/null || fail "installed oscar-inspect"
echo "installed tools: ok"
rm -rf "$work"

#!/usr/bin/env bash
# CI: install dependencies, build everything with ASan/UBSan and -Werror,
# run the README's test command. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install-deps.sh
export OSCAR_REQUIRE_BACKENDS="${OSCAR_REQUIRE_BACKENDS:-opencl}"
cmake -S . -B build -DOSCAR_SANITIZE=ON -DOSCAR_HIP=AUTO -DOSCAR_OPENCL=ON
cmake --build build -j2
ctest --test-dir build --output-on-failure

#!/usr/bin/env bash
# CI: install dependencies, build everything with ASan/UBSan and -Werror,
# run the README's test command (it includes install_consumer: install to a
# prefix, build and run consumers with CMake and pkg-config), then build the
# Python package with pip and run its tests. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install-deps.sh
export OSCAR_REQUIRE_BACKENDS="${OSCAR_REQUIRE_BACKENDS:-opencl}"
cmake -S . -B build -DOSCAR_SANITIZE=ON -DOSCAR_HIP=AUTO -DOSCAR_OPENCL=ON
cmake --build build -j2
ctest --test-dir build --output-on-failure
bash ci/python.sh

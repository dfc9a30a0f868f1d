#!/usr/bin/env bash
# CI: the Python package as a user gets it. `pip install ./python` in a fresh
# venv (scikit-build-core builds the same CMake and bundles the libraries and
# plugins), then pytest on the CPU backend (the CUDA tests skip: no GPU here).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${OSCAR_VENV:-$repo/build-venv}
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q "scikit-build-core>=0.10" jinja2 numpy pytest
# CUDA and HIP plugins are built and checked by the main CI build; the wheel
# here needs only what can run (CPU built in, OpenCL on PoCL).
"$venv/bin/pip" install -q --no-build-isolation "$repo/python" \
  --config-settings=cmake.define.OSCAR_CUDA=OFF --config-settings=cmake.define.OSCAR_HIP=OFF \
  --config-settings=cmake.define.OSCAR_OPENCL=ON
# From outside the tree, so `import liboscar` is the installed package.
cd /
OSCAR_REQUIRE_CALIB=1 OSCAR_REQUIRE_BACKENDS=${OSCAR_REQUIRE_BACKENDS:-opencl} "$venv/bin/python" -m pytest -q -rs "$repo/python/tests"

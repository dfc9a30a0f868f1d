#!/usr/bin/env bash
# Debian packages liboscar needs to build and test (run as root).
set -euo pipefail
pkgs=(build-essential cmake pkg-config python3 python3-jinja2 python3-venv
      libcriterion-dev libjansson-dev libopenblas-dev liblapack-dev liblapacke-dev
      ocl-icd-opencl-dev opencl-headers pocl-opencl-icd clinfo
      hipcc libamdhip64-dev gnuplot-nox)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "ci: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "ci: all Debian packages present"
fi

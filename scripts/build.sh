#!/usr/bin/env bash
# Configures and builds klinear into build/ (Release). Extra arguments go to cmake, e.g.
#   scripts/build.sh -DKLINEAR_CUDA=ON
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$(nproc)"

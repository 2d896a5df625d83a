#!/usr/bin/env bash
# Configures and builds klinear into build/ (Release): every target, or only those named.
#   scripts/build.sh                 # everything (CLI, tests, benchmarks)
#   scripts/build.sh klinear         # only the CLI
# Extra cmake options go in KLINEAR_CMAKE_ARGS, e.g. KLINEAR_CMAKE_ARGS=-DKLINEAR_CUDA=ON.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC2086
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${KLINEAR_CMAKE_ARGS:-} >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build build -j "$(nproc)" "${targets[@]}"

#!/usr/bin/env bash
# Sets up, builds and runs every CPU test: the full suite in a Release build, then the input
# parsing tests (safetensors, checkpoint, config, tokenizer files) again under AddressSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
(cd build && ctest --output-on-failure -j "$(nproc)")
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKLINEAR_ASAN=ON >/dev/null
cmake --build build-asan -j "$(nproc)" --target klinear_tests
ASAN_OPTIONS=detect_leaks=1 ./build-asan/klinear_tests --gtest_brief=1 \
  --gtest_filter='Safetensors*:Checkpoint*:Config*:DType*:Mxfp4*:Tokenizer*'

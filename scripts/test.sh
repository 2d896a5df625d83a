#!/usr/bin/env bash
# Sets up, builds and runs every CPU test: the full suite in a Release build, then the input
# parsing and hostile-input tests (safetensors, checkpoint, config, tokenizer files, the hostile
# tables of tests/io/hostile_test.cc and tests/tools/hostile_cli_test.cc, the context and
# non-finite limits of tests/tools/limits_cli_test.cc) again under ASan + UBSan,
# then every libFuzzer target of fuzz/ for a short smoke run (scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
(cd build && ctest --output-on-failure -j "$(nproc)")
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKLINEAR_ASAN=ON >/dev/null
cmake --build build-asan -j "$(nproc)" --target klinear_tests
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ./build-asan/klinear_tests --gtest_brief=1 \
  --gtest_filter='Safetensors*:Checkpoint*:Config*:DType*:Mxfp4*:Tokenizer*:Hostile*:Limits*'
for target in $(bash scripts/fuzz.sh --list); do
  bash scripts/fuzz.sh "$target" "${KLINEAR_FUZZ_SMOKE_SECONDS:-5}"
done

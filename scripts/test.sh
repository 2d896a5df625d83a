#!/usr/bin/env bash
# Sets up, builds and runs every CPU test: the full suite in a Release build, then the input
# parsing and hostile-input tests (safetensors, checkpoint, config, tokenizer files, the hostile
# tables of tests/io/hostile_test.cc and tests/tools/hostile_cli_test.cc, the context and
# non-finite limits of tests/tools/limits_cli_test.cc) again under ASan + UBSan, the server's HTTP
# tests (tests/server/*.py) against the ASan + UBSan binaries,
# then every libFuzzer target of fuzz/ for a short smoke run (scripts/fuzz.sh).
# Where nvcc is installed (CI has one, and no GPU) the Release build includes the CUDA backend, so
# the CUDA code is compiled; its test rows skip without a GPU (scripts/gpu-check.sh runs them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
nvcc=$(command -v nvcc || true)
[ -n "$nvcc" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc=/usr/local/cuda/bin/nvcc
if [ -n "$nvcc" ]; then
  export KLINEAR_CMAKE_ARGS="${KLINEAR_CMAKE_ARGS:-} -DKLINEAR_CUDA=ON -DCMAKE_CUDA_COMPILER=$nvcc"
else
  echo "test.sh: no nvcc found: building without the CUDA backend"
fi
bash scripts/build.sh
(cd build && ctest --output-on-failure -j "$(nproc)")
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKLINEAR_ASAN=ON >/dev/null
cmake --build build-asan -j "$(nproc)" --target klinear_tests
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ./build-asan/klinear_tests --gtest_brief=1 \
  --gtest_filter='Safetensors*:Checkpoint*:Config*:DType*:Mxfp4*:Tokenizer*:Hostile*:Limits*'
# The server driven over HTTP (hostile clients, then the OpenAI client with a short soak) by the
# ASan + UBSan binaries: a leak fails the drain checks' exit status, UBSan aborts the server.
cmake --build build-asan -j "$(nproc)" --target klinear klinear_scripted_server
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
python3 tests/server/hostile_server_test.py --klinear build-asan/klinear --source .
KLINEAR_SOAK_SECONDS=10 python3 tests/server/openai_client_test.py --klinear build-asan/klinear \
  --scripted-server build-asan/klinear_scripted_server --source .
unset ASAN_OPTIONS UBSAN_OPTIONS
for target in $(bash scripts/fuzz.sh --list); do
  bash scripts/fuzz.sh "$target" "${KLINEAR_FUZZ_SMOKE_SECONDS:-5}"
done

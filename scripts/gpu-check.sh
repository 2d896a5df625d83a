#!/usr/bin/env bash
# One command on the GPU machine (an H200 with nvcc, torch and triton, no registry access):
#   scripts/gpu-check.sh OUTDIR
# 1. unpacks third_party/gpu-carry (made here by `scripts/setup.sh --gpu`): the library debs into a
#    prefix (dpkg -x, nothing installed system-wide) and the FLA wheel into a Python path;
# 2. builds with -DKLINEAR_CUDA=ON (sm_90a) into build-gpu/;
# 3. runs every test (ctest: the CPU suite and the GPU tests);
# 4. runs the benchmarks: bench/cuda/ops_bench (klinear) and bench/cuda/fla_bench.py (FLA) on the
#    same shapes;
# 5. runs compute-sanitizer memcheck over the GPU tests;
# and writes each step's log plus summary.md (step, status, seconds; the benchmark tables) to OUTDIR.
# Every step runs even when an earlier one fails; the exit status is non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu-check.sh OUTDIR}
mkdir -p "$out"
summary="$out/summary.md"
echo "# gpu-check $(date -u +%Y-%m-%dT%H:%MZ) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)" >"$summary"
echo "| step | status | seconds |" >>"$summary"
echo "|---|---|---|" >>"$summary"
failed=0

step() {  # name, command...
  local name=$1
  shift
  local t0=$SECONDS
  echo "== $name: $*"
  if "$@" >"$out/$name.log" 2>&1; then
    echo "| $name | ok | $((SECONDS - t0)) |" >>"$summary"
  else
    echo "| $name | FAILED ($?) | $((SECONDS - t0)) |" >>"$summary"
    failed=1
    tail -n 40 "$out/$name.log"
  fi
}

deps=/tmp/klinear-deps
arch=x86_64-linux-gnu
unpack() {
  mkdir -p "$deps" /tmp/klinear-py
  for deb in third_party/gpu-carry/debs/*.deb; do dpkg -x "$deb" "$deps"; done
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/klinear-py third_party/gpu-carry/*.whl
}
step unpack unpack
export PKG_CONFIG_PATH=$deps/usr/lib/$arch/pkgconfig:$deps/usr/share/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=$deps
export LD_LIBRARY_PATH=$deps/usr/lib/$arch:$deps/usr/lib/$arch/openblas-openmp:${LD_LIBRARY_PATH:-}
export PYTHONPATH=/tmp/klinear-py:${PYTHONPATH:-}
export PATH=$PATH:/usr/local/cuda/bin

configure() {
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DKLINEAR_CUDA=ON -DKLINEAR_DEPS_ROOT="$deps" \
    -DCMAKE_PREFIX_PATH="$deps/usr" -DCMAKE_CUDA_COMPILER="$(command -v nvcc)"
}
step configure configure
step build cmake --build build-gpu -j "$(nproc)"
step ctest bash -c "cd build-gpu && ctest --output-on-failure -j 4 --timeout 600"
step ops_bench build-gpu/ops_bench all
step fla_bench env PYTHONUNBUFFERED=1 python3 bench/cuda/fla_bench.py all
# memcheck last (it is the slowest step); KLINEAR_MEMCHECK_TIMEOUT caps it (seconds).
step memcheck timeout "${KLINEAR_MEMCHECK_TIMEOUT:-1800}" compute-sanitizer --tool memcheck --error-exitcode 1 \
  build-gpu/klinear_tests --gtest_filter='Cuda*' --gtest_brief=1

{
  echo
  echo "## klinear (bench/cuda/ops_bench)"
  grep '^|' "$out/ops_bench.log" || echo "(no table)"
  echo
  echo "## FLA (bench/cuda/fla_bench.py)"
  grep '^|' "$out/fla_bench.log" || echo "(no table)"
  echo
  echo "## ctest"
  grep -E 'tests passed|tests failed|Skipped|Failed|\*\*\*' "$out/ctest.log" | tail -20
  echo
  echo "## memcheck"
  grep -E 'ERROR SUMMARY|PASSED|FAILED' "$out/memcheck.log" | tail -5
} >>"$summary"
cat "$summary"
exit $failed

#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan, build-fuzz/) and runs one of them.
#   scripts/fuzz.sh TARGET SECONDS [libFuzzer options...]
#   scripts/fuzz.sh config 60            # fuzz/config_fuzz.cc for one minute
#   scripts/fuzz.sh --list               # the targets
# The seed corpus fuzz/corpus/TARGET is read, never written: new inputs go to
# build-fuzz/corpus/TARGET. A finding leaves its input in build-fuzz/findings/ and exits non-zero.
# The last line printed is "fuzz TARGET: N executions in S s, no finding".
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--list" ]; then
  for f in fuzz/*_fuzz.cc; do basename "$f" _fuzz.cc; done
  exit 0
fi
if [ $# -lt 2 ]; then
  echo "usage: scripts/fuzz.sh TARGET SECONDS [libFuzzer options...] (targets: scripts/fuzz.sh --list)" >&2
  exit 2
fi
target=$1 seconds=$2
shift 2
[ -f "fuzz/${target}_fuzz.cc" ] || { echo "fuzz.sh: no target '$target' (see --list)" >&2; exit 2; }
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKLINEAR_FUZZ=ON >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target "${target}_fuzz" >/dev/null
mkdir -p "build-fuzz/corpus/$target" build-fuzz/findings
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
"build-fuzz/fuzz/${target}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
  -print_final_stats=1 -artifact_prefix="build-fuzz/findings/${target}-" "$@" \
  "build-fuzz/corpus/$target" "fuzz/corpus/$target" >"$log" 2>&1
rc=$?
set -e
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
if [ $rc -ne 0 ]; then
  tail -60 "$log" >&2
  echo "fuzz $target: FINDING after ${runs:-?} executions (exit $rc); inputs in build-fuzz/findings/" >&2
  exit 1
fi
echo "fuzz $target: ${runs:-?} executions in $seconds s, no finding"

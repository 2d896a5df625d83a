#!/usr/bin/env bash
# One command on the GPU machine (an H200 with nvcc, torch and triton, no registry access):
#   scripts/gpu-check.sh OUTDIR
# 1. unpacks third_party/gpu-carry (made here by `scripts/setup.sh --gpu`): the library debs into a
#    prefix (dpkg -x, nothing installed system-wide), the FLA wheel into a Python path, the
#    CUTLASS headers into third_party/cutlass/include and FlashInfer's (with its CCCL and CUTLASS's
#    util headers) into third_party/flashinfer and third_party/cutlass/util (where CMake looks for them);
# 2. builds with -DKLINEAR_CUDA=ON (sm_90a) into build-gpu/ (or takes a prebuild's binaries: below);
# 3. runs every GPU test: the CUDA rows of the row-parametrised suite (every op against plain
#    references, every model fixture, batched == alone), failing if any of them skipped;
# 4. runs `klinear generate --device cuda` on the fixture models: float32 must give the CPU's
#    greedy ids, bfloat16 must run (its ids are logged beside the CPU's); then the
#    Kimi-Linear-48B-A3B config with dummy weights: info, generate, and model_bench (prefill 8k in
#    the engine's default step, decode at batch 1, 64 and 256 with 4k positions of context each),
#    where one prefill step and one decode step spend their kernel time (profile_48b: ncu,
#    tools/ncu_kernel_times.py), and
#    `klinear run` over 1,000 lines plus `klinear bench-serve` against `klinear serve` on it
#    (serve_48b);
# 5. runs the benchmarks: bench/cuda/ops_bench (klinear) and bench/cuda/fla_bench.py (FLA) on the
#    same shapes, nvidia-smi sampling the SM clock, power and temperature meanwhile (clocks.csv);
#    mxfp4_48b: the same shapes with MXFP4 routed experts beside bf16 (issue 38);
# 6. runs compute-sanitizer memcheck over the GPU tests (capped: see memcheck below);
# and writes each step's log plus summary.md (step, status, seconds; the benchmark tables) to OUTDIR.
# The CPU suite is CI's (scripts/test.sh); KLINEAR_GPU_CHECK_CPU=1 runs it here too.
# KLINEAR_GPU_CHECK_BASELINE=TAR adds the step baseline_48b: the 48B rows of this tree and of an
# older one (the tar) in turns, before and after side by side.
# KLINEAR_GPU_CHECK_48B_LAYERS=N runs every 48B step on the config's first N layers (16 fit an 80 GB
# H100; the whole model needs an H200).
# KLINEAR_GPU_CHECK_SKIP names steps to leave out (space-separated: e.g. "fla_bench memcheck").
# KLINEAR_GPU_CHECK_OPS names the ops_bench family to run (default all; e.g. "moe").
# Every step runs even when an earlier one fails; the exit status is non-zero if any failed.
# On the H200 (2026-12-01): build 80-117 s, GPU tests 49-92 s (the bf16 consistency rows redraw
# chaotic checkpoints), generate 8 s, e2e_48b 9 s, serve_48b ~4 min with the default matrix,
# ops_bench 181 s (its kda group 70-78 s), fla_bench 257-273 s (Triton compiling), memcheck 3 + 48 s.
# Under a 10-minute limit per command, run it in three calls, e.g.
# KLINEAR_GPU_CHECK_SKIP="serve_48b ops_bench fla_bench", then "gpu_tests generate e2e_48b serve_48b
# memcheck_ops memcheck_models" (the benchmarks beside FLA's), then the serve step alone.
#
#   scripts/gpu-check.sh --prebuild
# run here (nvcc, no GPU needed) saves the GPU machine its build: it builds the tree as a device
# call copies it (tracked files and untracked ones git does not ignore) in /tmp/klinear-prebuilt/src
# and packs the binaries, with a sha256 manifest of those files, into
# third_party/gpu-carry/prebuilt.tar.xz (~10 MB; with the tree and the rest of the carry ~61 MB of
# the 64 MiB a device call takes). On the GPU machine step 2 then unpacks them
# instead of compiling when every file of the manifest is unchanged and src/, tests/, bench/,
# tools/, fuzz/ and tokenizers/ hold no other file (their compiled-in source directory,
# /tmp/klinear-prebuilt/src, becomes a link to this tree); otherwise, and with KLINEAR_GPU_CHECK_CPU=1
# (ctest needs the CMake tree), it builds as before. A full prebuild took 11 min on 2 cores; a
# later one rebuilds only what changed. Unpacking and checking took 4 s (a device tree simulated here).
set -uo pipefail
cd "$(dirname "$0")/.."
prebuilt=/tmp/klinear-prebuilt
pack=third_party/gpu-carry/prebuilt.tar.xz
binaries=(klinear klinear_tests model_bench ops_bench engine_host_bench klinear_scripted_server)

# The files a device call copies that the binaries or the tests read (docs, scripts and CI aside).
tree_files() {
  git ls-files -co --exclude-standard -z | while IFS= read -r -d '' f; do
    case $f in docs/* | scripts/* | .ci/* | *.md) continue ;; esac
    [ -f "$f" ] && printf '%s\0' "$f"
  done
}

prebuild() {
  local src=$prebuilt/src nvcc
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  [ -x "$nvcc" ] || { echo "gpu-check --prebuild: no nvcc" >&2; return 1; }
  [ -d third_party/cutlass/include ] && [ -d third_party/flashinfer/include ] && [ -d third_party/gpu-carry ] ||
    { echo "gpu-check --prebuild: run scripts/setup.sh --gpu first" >&2; return 1; }
  mkdir -p "$src/build-gpu"
  # The tree afresh (a file deleted here must not stay behind for CMake's globs), each file with its
  # own modification time, so that the build recompiles only what changed since the last prebuild.
  find "$src" -mindepth 1 -maxdepth 1 ! -name build-gpu -exec rm -rf {} +
  git ls-files -co --exclude-standard -z | tar --null --ignore-failed-read -T - -cf - | tar -xf - -C "$src"
  ln -sfn "$PWD/third_party" "$src/third_party"
  # A file edited since the last prebuild copied the tree can be older than the objects that build
  # made from its earlier text (edited while that build ran): every file whose hash changed gets the
  # present time, so make rebuilds what depends on it.
  local manifest=$src/build-gpu/manifest.sha256
  tree_files | xargs -0 sha256sum >"$manifest.new"
  if [ -f "$manifest" ]; then
    comm -13 <(sort "$manifest") <(sort "$manifest.new") | cut -c67- | (cd "$src" && xargs -r -d '\n' touch --)
  fi
  mv "$manifest.new" "$manifest"
  cmake -S "$src" -B "$src/build-gpu" -DCMAKE_BUILD_TYPE=Release -DKLINEAR_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" \
    >/dev/null || return 1
  local targets=()
  for b in "${binaries[@]}"; do targets+=(--target "$b"); done
  cmake --build "$src/build-gpu" -j "$(nproc)" "${targets[@]}" || return 1
  tar -cJf "$pack" -C "$src" build-gpu/manifest.sha256 "${binaries[@]/#/build-gpu/}" || return 1
  echo "gpu-check --prebuild: $(du -h "$pack" | cut -f1) in $pack, built from $(wc -l <"$src/build-gpu/manifest.sha256") files"
}

case ${1:-} in
  -h | --help)
    sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
    ;;
  --prebuild)
    prebuild
    exit
    ;;
esac
out=${1:?usage: scripts/gpu-check.sh OUTDIR (or --prebuild, --help)}
mkdir -p "$out"
summary="$out/summary.md"
echo "# gpu-check $(date -u +%Y-%m-%dT%H:%MZ) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)" >"$summary"
echo "| step | status | seconds |" >>"$summary"
echo "|---|---|---|" >>"$summary"
failed=0

step() {  # name, command...
  local name=$1
  shift
  case " ${KLINEAR_GPU_CHECK_SKIP:-} " in *" $name "*) echo "| $name | left out | 0 |" >>"$summary"; return ;; esac
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
  # Unpacked afresh each run: a warm machine may keep an older copy from an earlier carry.
  rm -rf third_party/cutlass/include third_party/cutlass/util third_party/flashinfer
  mkdir -p third_party/cutlass
  tar -xzf third_party/gpu-carry/cutlass-include.tar.gz -C third_party/cutlass
  tar -xzf third_party/gpu-carry/flashinfer-include.tar.gz -C third_party
}
step unpack unpack
export PKG_CONFIG_PATH=$deps/usr/lib/$arch/pkgconfig:$deps/usr/share/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=$deps
export LD_LIBRARY_PATH=$deps/usr/lib/$arch:$deps/usr/lib/$arch/openblas-openmp:${LD_LIBRARY_PATH:-}
export PYTHONPATH=/tmp/klinear-py:${PYTHONPATH:-}
export PATH=$PATH:/usr/local/cuda/bin
# NCCL (src/dist/nccl_comm.cc): the CUDA toolkit's where it has one, else the nvidia-nccl wheel
# PyTorch brings (lib/libnccl.so.2, include/nccl.h); the binaries find it through LD_LIBRARY_PATH.
nccl_root=
if ! ls /usr/local/cuda/lib*/libnccl.so* >/dev/null 2>&1 && ! ldconfig -p 2>/dev/null | grep -q libnccl.so; then
  nccl_root=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)
  [ -n "$nccl_root" ] && export LD_LIBRARY_PATH=$nccl_root/lib:$LD_LIBRARY_PATH
fi
echo "gpu-check: NCCL from ${nccl_root:-the CUDA toolkit or the system}"

configure() {
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DKLINEAR_CUDA=ON -DKLINEAR_DEPS_ROOT="$deps" \
    -DCMAKE_PREFIX_PATH="$deps/usr" -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" ${nccl_root:+-DNCCL_ROOT=$nccl_root}
}
# The binaries of a prebuild made from this very tree, if there is one (see --prebuild).
use_prebuilt() {
  [ -f "$pack" ] && [ "${KLINEAR_GPU_CHECK_CPU:-0}" != 1 ] || return 1
  if [ -d "$prebuilt/src" ] && [ ! -L "$prebuilt/src" ]; then
    echo "prebuilt: $prebuilt/src is a prebuild's own tree (the machine that made it)"
    return 1
  fi
  local unpacked=$prebuilt-unpacked
  rm -rf "$unpacked" && mkdir -p "$unpacked" && tar -xJf "$pack" -C "$unpacked" || return 1
  local manifest=$unpacked/build-gpu/manifest.sha256
  if ! sha256sum --check --quiet --strict "$manifest"; then
    echo "prebuilt: files changed since the prebuild"
    return 1
  fi
  if ! diff <(find src tests bench tools fuzz tokenizers -type f ! -path '*/__pycache__/*' ! -name '*.md' | sort) \
    <(awk '{print $2}' "$manifest" | grep -E '^(src|tests|bench|tools|fuzz|tokenizers)/' | sort); then
    echo "prebuilt: files added since the prebuild"
    return 1
  fi
  mkdir -p "$prebuilt" && ln -sfn "$PWD" "$prebuilt/src" || return 1
  rm -rf build-gpu && mkdir -p build-gpu && cp "${binaries[@]/#/$unpacked/build-gpu/}" build-gpu/ || return 1
  if ldd build-gpu/klinear_tests | grep 'not found'; then
    echo "prebuilt: libraries missing"
    return 1
  fi
}
t0=$SECONDS
if use_prebuilt >"$out/prebuilt.log" 2>&1; then
  echo "| build | prebuilt | $((SECONDS - t0)) |" >>"$summary"
else
  cat "$out/prebuilt.log"
  step configure configure
  step build cmake --build build-gpu -j "$(nproc)"
fi

gpu_filter='*cuda_f32:*cuda_bf16'
gpu_tests() {  # the CUDA rows; a skipped CUDA row on this machine is a failure
  build-gpu/klinear_tests --gtest_filter="$gpu_filter" || return 1
  if grep -q '^\[  SKIPPED \]' "$out/gpu_tests.log"; then
    echo "gpu-check: CUDA rows were skipped on a GPU machine"
    return 1
  fi
}
step gpu_tests gpu_tests

generate_e2e() {  # klinear generate --device cuda against --device cpu on each fixture model
  local rc=0 model cpu f32 bf16
  for model in tests/fixtures/{kimi-linear-tiny,kimi-linear-tiny-bf16,k3-tiny,k3-tiny-mxfp4}/model; do
    local args=(generate --model "$model" --prompt-ids 1,2,3,4,5,6,7 --max-tokens 24 --ignore-eos --json)
    cpu=$(build-gpu/klinear "${args[@]}" --device cpu) || return 1
    f32=$(build-gpu/klinear "${args[@]}" --device cuda --dtype float32) || return 1
    bf16=$(build-gpu/klinear "${args[@]}" --device cuda --dtype bfloat16) || return 1
    python3 - "$model" "$cpu" "$f32" "$bf16" <<'PY' || rc=1
import json, sys
model, cpu, f32, bf16 = sys.argv[1], *(json.loads(a) for a in sys.argv[2:])
same = sum(a == b for a, b in zip(cpu["ids"], bf16["ids"]))
print(f"{model}: cpu {cpu['ids']}\n  cuda float32  {f32['ids']}")
print(f"  cuda bfloat16 {bf16['ids']} ({same}/{len(cpu['ids'])} as cpu)")
secs = " ".join(f"{n} {r['decode_seconds']:.4f}" for n, r in (("cpu", cpu), ("cuda f32", f32), ("bf16", bf16)))
print(f"  decode s: {secs}")
sys.exit(0 if f32["ids"] == cpu["ids"] and len(bf16["ids"]) == len(cpu["ids"]) else 1)
PY
  done
  return $rc
}
step generate generate_e2e

# The Kimi-Linear-48B-A3B config.json (dummy weights: 91.4 GiB in bf16, an H200's size) in $1.
# KLINEAR_GPU_CHECK_48B_LAYERS=N keeps its first N layers (one MLA layer in four, as the model
# has), so that the 48B steps fit an 80 GB H100: 16 layers, 53.5 GiB. Rows measured so are
# comparable only with rows of the same N.
init_48b() {
  build-gpu/klinear init --preset kimi-linear-48b-a3b --config-only --out "$1" >/dev/null || return 1
  [ -z "${KLINEAR_GPU_CHECK_48B_LAYERS:-}" ] && return 0
  python3 - "$1/config.json" "$KLINEAR_GPU_CHECK_48B_LAYERS" <<'PY'
import json, sys
path, n = sys.argv[1], int(sys.argv[2])
c = json.load(open(path))
la = c["linear_attn_config"]  # layer numbers from 1
la["full_attn_layers"] = [i for i in range(1, n + 1) if i % 4 == 0]
la["kda_layers"] = [i for i in range(1, n + 1) if i % 4 != 0]
c["num_hidden_layers"] = n
json.dump(c, open(path, "w"), indent=2)
PY
}

e2e_48b() {  # the Kimi-Linear-48B-A3B config with dummy weights made on the GPU, bf16
  local dir=/tmp/klinear-48b
  init_48b "$dir" || return 1
  build-gpu/klinear info --model "$dir" --load-format dummy || return 1
  build-gpu/klinear generate --model "$dir" --load-format dummy --device cuda --prompt-ids 1,2,3,4,5,6,7 \
    --max-tokens 16 --ignore-eos --json || return 1
  printf 'Hello!\n/reset\nAgain.\n' | build-gpu/klinear chat --model "$dir" --load-format dummy --device cuda \
    --tokenizer tokenizers/kimi-k2 --max-tokens 8 || return 1
  build-gpu/model_bench --device cuda --load-format dummy --prefill 8192 --decode 16 --runs 2 --batch 64 \
    --batch 256 --context 4096 "$dir"
}
step e2e_48b e2e_48b

mxfp4_48b() {  # issue 38: the 48B shapes with MXFP4 routed experts (dummy, packed on the GPU) beside bf16
  local dir=/tmp/klinear-48b mx=/tmp/klinear-48b-mxfp4
  init_48b "$dir" || return 1
  build-gpu/klinear init --preset kimi-linear-48b-a3b-mxfp4 --config-only --out "$mx" >/dev/null || return 1
  python3 - "$dir/config.json" "$mx/config.json" <<'PY' || return 1
import json, sys  # the MXFP4 config takes the bf16 one's layers (KLINEAR_GPU_CHECK_48B_LAYERS)
c = json.load(open(sys.argv[1]))
c["quantization_config"] = json.load(open(sys.argv[2]))["quantization_config"]
json.dump(c, open(sys.argv[2], "w"), indent=2)
PY
  build-gpu/klinear info --model "$mx" --load-format dummy | tail -6 || return 1
  build-gpu/klinear generate --model "$mx" --load-format dummy --device cuda --prompt-ids 1,2,3,4,5,6,7 \
    --max-tokens 16 --ignore-eos --json || return 1
  build-gpu/model_bench --device cuda --load-format dummy --prefill 8192 --decode 16 --runs 2 --batch 1 --batch 64 \
    --batch 256 --context 4096 "$mx" "$dir"
}
step mxfp4_48b mxfp4_48b

# Before and after side by side (KLINEAR_GPU_CHECK_BASELINE=a tar of an older tree, e.g.
# `git archive REV src bench tools fuzz tests/*.h CMakeLists.txt ...`, carried under third_party/):
# that tree's model_bench is built beside this one's, and both run the e2e_48b rows in turns
# (new, old, new, old) in this one command, so the two sets of figures share the machine's state.
baseline_48b() {
  local base=/tmp/klinear-baseline dir=/tmp/klinear-48b
  rm -rf "$base" && mkdir -p "$base" && tar -xf "$KLINEAR_GPU_CHECK_BASELINE" -C "$base" || return 1
  ln -sfn "$PWD/third_party" "$base/third_party"
  cmake -S "$base" -B "$base/build" -DCMAKE_BUILD_TYPE=Release -DKLINEAR_CUDA=ON -DKLINEAR_DEPS_ROOT="$deps" \
    -DCMAKE_PREFIX_PATH="$deps/usr" -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" >/dev/null || return 1
  cmake --build "$base/build" -j "$(nproc)" --target model_bench >/dev/null || return 1
  init_48b "$dir" || return 1
  local round bench
  for round in 1 2; do
    for bench in build-gpu/model_bench "$base/build/model_bench"; do
      echo "### round $round: $bench"
      "$bench" --device cuda --load-format dummy --prefill 8192 --decode 16 --runs 2 --batch 1 --batch 64 \
        --batch 256 --context 4096 "$dir" || return 1
    done
  done
}
[ -n "${KLINEAR_GPU_CHECK_BASELINE:-}" ] && step baseline_48b baseline_48b

profile_48b() {  # where a 48B step's GPU time goes: ncu's duration of each kernel of one prefill step
  # (2,048 tokens) and of one decode step at batch 64 (4k context), summed by kernel
  local dir=/tmp/klinear-48b range csv rc=0
  [ -f "$dir/config.json" ] || init_48b "$dir" || return 1
  for range in "prefill" "decode b64"; do
    csv="$out/profile_48b_${range// /_}.csv"
    timeout 300 ncu --nvtx --nvtx-include "$range/" --metrics gpu__time_duration.sum --csv --print-kernel-base function \
      --log-file "$csv" build-gpu/model_bench --device cuda --load-format dummy --prefill 2048 --decode 1 --runs 1 \
      --batch 64 --context 4096 "$dir" || rc=1
    echo "### $range"
    python3 tools/ncu_kernel_times.py "$csv" --top 15 || rc=1
  done
  return $rc
}
step profile_48b profile_48b

serve_48b() {  # issue 8 on the 48B dummy: `klinear run` over 1,000 lines, then bench-serve against `klinear serve`
  local dir=/tmp/klinear-48b port=18080 rc=0
  [ -f "$dir/config.json" ] || init_48b "$dir" || return 1
  python3 -c "
import json, random
r = random.Random(7)
with open('/tmp/klinear-run.jsonl', 'w') as f:
    for i in range(1000):
        f.write(json.dumps({'id': f'l{i}', 'prompt_ids': [r.randrange(1, 160000) for _ in range(r.randrange(16, 256))]}) + '\n')
"
  build-gpu/klinear run --model "$dir" --load-format dummy --device cuda --input /tmp/klinear-run.jsonl \
    --output /tmp/klinear-run.out.jsonl --max-batch 256 --max-tokens 32 --ignore-eos || rc=1
  echo "run: $(wc -l </tmp/klinear-run.out.jsonl) result lines"
  build-gpu/klinear serve --model "$dir" --load-format dummy --device cuda --port $port --max-num-seqs 256 \
    --max-queue 4096 >"$out/serve_48b_server.log" 2>&1 &
  local pid=$!
  for _ in $(seq 300); do python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null && break; sleep 1; done
  # KLINEAR_SERVE_MATRIX: "streams:input:output:prefix ..." (the issue's matrix is 1/16/64/256 streams x
  # 8k/1k and 1k/1k x prefix 0/4k; the default is what fits one call beside the run: ~3 minutes on
  # the H200, where 256 x 8k/1k alone takes ~4.5)
  local cfg
  for cfg in ${KLINEAR_SERVE_MATRIX:-1:1024:1024:0 16:1024:1024:0 64:1024:1024:0 16:8192:1024:0 16:8192:1024:4096 256:1024:256:0}; do
    IFS=: read -r c l k p <<<"$cfg"
    echo "== bench-serve concurrency $c input $l output $k prefix $p"
    timeout 240 build-gpu/klinear bench-serve --url "http://127.0.0.1:$port" --concurrency "$c" --requests "$c" \
      --input-len "$l" --output-len "$k" --prefix-len "$p" || rc=1
  done
  kill -INT $pid
  wait $pid || rc=1
  return $rc
}
step serve_48b serve_48b
# The GPU's SM clock, power and temperature every 200 ms while the benchmarks run (clocks.csv; the
# summary gives their range): lent machines differ, and a compute-bound row moves with the clock.
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 200 \
  >"$out/clocks.csv" 2>/dev/null &
clocks_pid=$!
step ops_bench build-gpu/ops_bench "${KLINEAR_GPU_CHECK_OPS:-all}"
step fla_bench env PYTHONUNBUFFERED=1 python3 bench/cuda/fla_bench.py all
kill "$clocks_pid" 2>/dev/null
wait "$clocks_pid" 2>/dev/null
if [ "${KLINEAR_GPU_CHECK_CPU:-0}" = 1 ]; then
  step cpu_ctest bash -c "cd build-gpu && ctest --output-on-failure -j $(nproc) --timeout 600 -E 'cuda_(f32|bf16)'"
fi
# memcheck last (the slowest steps): the op tests, then the model tests. Each is capped by
# KLINEAR_MEMCHECK_TIMEOUT seconds and, when KLINEAR_GPU_CHECK_BUDGET (seconds for the whole script)
# is set, by what is left of it.
memcheck() {  # gtest filter
  local cap=${KLINEAR_MEMCHECK_TIMEOUT:-1800}
  if [ -n "${KLINEAR_GPU_CHECK_BUDGET:-}" ]; then
    local left=$((KLINEAR_GPU_CHECK_BUDGET - SECONDS - 10))
    [ "$left" -lt "$cap" ] && cap=$left
    [ "$cap" -gt 0 ] || { echo "memcheck: no time left in KLINEAR_GPU_CHECK_BUDGET"; return 1; }
  fi
  timeout "$cap" compute-sanitizer --tool memcheck --error-exitcode 1 build-gpu/klinear_tests --gtest_filter="$1" \
    --gtest_brief=1
}
step memcheck_ops memcheck 'Backends/*cuda_f32:Backends/*cuda_bf16'
step memcheck_models memcheck '*cuda_f32:*cuda_bf16-Backends/*'

{
  echo
  echo "## klinear (bench/cuda/ops_bench)"
  grep '^|' "$out/ops_bench.log" || echo "(no table)"
  echo
  echo "## FLA (bench/cuda/fla_bench.py)"
  grep '^|' "$out/fla_bench.log" || echo "(no table)"
  echo
  echo "## GPU during the benchmarks (nvidia-smi every 200 ms, samples drawing over 200 W)"
  python3 - "$out/clocks.csv" <<'PY' || echo "(no samples)"
import statistics, sys
rows = []
for line in open(sys.argv[1]):
    try:
        rows.append([float(x) for x in line.split(",")])
    except ValueError:
        pass
busy = [r for r in rows if r[1] > 200] or rows
sm, watts, temp = ([r[i] for r in busy] for i in range(3))
print(f"{len(busy)} of {len(rows)} samples: SM clock {min(sm):.0f} / {statistics.median(sm):.0f} / {max(sm):.0f} MHz"
      f" (min / median / max), power median {statistics.median(watts):.0f} W, max {max(temp):.0f} C")
PY
  echo
  echo "## GPU tests"
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |tests? from .* ran' "$out/gpu_tests.log" | tail -20
  echo
  echo "## generate --device cuda"
  cat "$out/generate.log" 2>/dev/null
  echo
  echo "## Kimi-Linear-48B-A3B dummy (model_bench)"
  grep -A4 '^model ' "$out/e2e_48b.log" 2>/dev/null || echo "(no table)"
  echo
  echo "## Kernel time of a 48B step (profile_48b, ncu)"
  grep -E '^(###|\||[0-9]+ kernels)' "$out/profile_48b.log" 2>/dev/null || echo "(no table)"
  echo
  echo "## klinear run + bench-serve on the 48B dummy"
  cat "$out/serve_48b.log" 2>/dev/null | grep -v '^\s*$' | tail -60
  echo
  echo "## memcheck"
  grep -E 'ERROR SUMMARY|PASSED|FAILED' "$out"/memcheck_*.log | tail -10
} >>"$summary"
cat "$summary"
exit $failed

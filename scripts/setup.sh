#!/usr/bin/env bash
# Installs what klinear builds and tests with. Idempotent; uses sudo when not root.
#   scripts/setup.sh          # the Debian 12 packages of the CPU build and the tests, and the PyPI
#                             # packages of the test oracles and clients (tiktoken for the K3 reference
#                             # encoder, openai for the server tests); where nvcc is installed (the CUDA
#                             # build is wanted: scripts/test.sh decides the same way) also the headers
#                             # the CUDA backend compiles with (git-ignored):
#     third_party/cutlass/include, third_party/cutlass/util/include   CUTLASS (the grouped GEMM;
#                             util: FlashInfer's hopper code includes it)
#     third_party/flashinfer/include, third_party/flashinfer/cccl     FlashInfer's headers and the
#                             CCCL it vendors (the MLA prefill's Hopper kernel)
#   scripts/setup.sh --gpu    # also fetches the pinned GPU dependencies into third_party/ (git-ignored):
#     third_party/wheels/     the PyPI wheels below, checked against their sha256
#     third_party/gpu-carry/  what the GPU machine needs and cannot download (scripts/gpu-check.sh
#                             unpacks it there): the FLA wheel, the CUTLASS and FlashInfer headers as
#                             tarballs, and the -dev debs of the libraries the build links (PCRE2,
#                             cpp-httplib, nlohmann-json, CLI11, GoogleTest, OpenBLAS, Open MPI), ~27 MiB, well
#                             inside the device tool's 64 MiB carry limit.
set -euo pipefail
cd "$(dirname "$0")/.."

gpu=0
for arg in "$@"; do
  case "$arg" in
    --gpu) gpu=1 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$arg' (expected --gpu or --help)" >&2; exit 2 ;;
  esac
done

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive

packages=(build-essential cmake pkg-config nlohmann-json3-dev libcli11-dev libpcre2-dev libopenblas-openmp-dev
          libgtest-dev libcpp-httplib-dev libopenmpi-dev openmpi-bin python3 python3-jinja2 python3-pip clang
          libclang-rt-14-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  $sudo apt-get update -q
  $sudo apt-get install -y -q "${missing[@]}"
fi
if ! python3 -c "import tiktoken" 2>/dev/null; then
  # Debian 12's python3 is externally managed (PEP 668): pip needs --break-system-packages there.
  $sudo python3 -m pip install -q tiktoken 2>/dev/null || $sudo python3 -m pip install -q --break-system-packages tiktoken
fi
# The server tests drive klinear serve with the official OpenAI Python client (PyPI).
if ! python3 -c "import openai" 2>/dev/null; then
  $sudo python3 -m pip install -q openai 2>/dev/null || $sudo python3 -m pip install -q --break-system-packages openai
fi

# ---- GPU dependencies: PyPI wheels pinned by version and sha256, unpacked into third_party/
fetch_wheel() {  # pip spec, file name, sha256
  mkdir -p third_party/wheels
  if [ ! -f "third_party/wheels/$2" ] || ! echo "$3  third_party/wheels/$2" | sha256sum -c --quiet - 2>/dev/null; then
    python3 -m pip download -q --no-deps --only-binary=:all: -d third_party/wheels "$1"
  fi
  echo "$3  third_party/wheels/$2" | sha256sum -c --quiet - ||
    { echo "setup.sh: $2 does not match its pinned sha256 $3" >&2; exit 1; }
}
unpack_include() {  # wheel, folder inside it, destination: only that folder is extracted
  if [ ! -d "$3" ]; then
    local tmp
    tmp=$(mktemp -d)
    python3 - "third_party/wheels/$1" "$2/" "$tmp" <<'PY'
import sys, zipfile
wheel, prefix, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, [n for n in z.namelist() if n.startswith(prefix)])
PY
    mkdir -p "$(dirname "$3")"
    mv "$tmp/$2" "$3"
    rm -rf "$tmp"
  fi
}
cutlass_wheel=nvidia_cutlass-4.2.0.0-py3-none-any.whl
flashinfer_wheel=flashinfer_python-0.7.2.post1-py3-none-any.whl

# Wherever nvcc is found, CMake's -DKLINEAR_CUDA=ON build needs: CUTLASS's headers (the grouped GEMM,
# src/backend/cuda/gemm/gemm_grouped.cu: include/, cute and cutlass, 27 MiB; and tools/util/include,
# 1 MiB, which FlashInfer's hopper headers include), and FlashInfer's (the MLA prefill's attention,
# src/backend/cuda/mla/mla_prefill_sm90.cu: include/, 6 MiB, and the CCCL 3.6 it vendors and compiles
# against, 20 MiB: CUDA 13.0's CCCL 3.0 lacks what its headers use).
nvcc=$(command -v nvcc || true)
[ -n "$nvcc" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc=/usr/local/cuda/bin/nvcc
if [ -n "$nvcc" ] || [ "$gpu" -eq 1 ]; then
  fetch_wheel nvidia-cutlass==4.2.0.0 $cutlass_wheel f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6
  unpack_include $cutlass_wheel cutlass_library/source/include third_party/cutlass/include
  unpack_include $cutlass_wheel cutlass_library/source/tools/util/include third_party/cutlass/util/include
  fetch_wheel flashinfer-python==0.7.2.post1 $flashinfer_wheel \
    bfdc18b9e1e4d8d0730fe4343dc0e284cd0c160086de80f99888bc4867922d49
  unpack_include $flashinfer_wheel flashinfer/data/include third_party/flashinfer/include
  for part in cub/cub libcudacxx/include thrust/thrust; do
    unpack_include $flashinfer_wheel flashinfer/data/cccl/$part third_party/flashinfer/cccl/$part
  done
fi

[ "$gpu" -eq 1 ] || exit 0

fetch_wheel fla-core==0.6.0 fla_core-0.6.0-py3-none-any.whl b0708b70e0b119cd58a0a5146ea56cb175cef6ed969d8ac60267e3e077ce3ebd

# The GPU machine reaches no registry: carry the FLA wheel and the libraries the build links as debs
# (scripts/gpu-check.sh unpacks them into a prefix with dpkg -x). cpp-httplib's pkg-config file
# names brotli, which the GPU machine lacks. Open MPI's library and what it loads (hwloc and the
# libudev hwloc needs, libevent; 3.9 MiB) let the build link and klinear start there; mpirun itself
# is not carried (one GPU runs without a launcher).
debs=(libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libcpp-httplib-dev libcpp-httplib0.11
      nlohmann-json3-dev libcli11-dev libgtest-dev libopenblas-openmp-dev libopenblas0-openmp libopenblas-dev
      libgfortran5 libquadmath0 libbrotli-dev libbrotli1 libopenmpi-dev libopenmpi3 libhwloc15
      libudev1 libevent-core-2.1-7 libevent-pthreads-2.1-7)
mkdir -p third_party/gpu-carry/debs
cp third_party/wheels/fla_core-0.6.0-py3-none-any.whl third_party/gpu-carry/
# The CUTLASS headers as a tarball (2.4 MiB; scripts/gpu-check.sh unpacks it into
# third_party/cutlass/include), remade whenever the pinned wheel is newer than it.
if [ ! -f third_party/gpu-carry/cutlass-include.tar.gz ] ||
   [ "third_party/wheels/$cutlass_wheel" -nt third_party/gpu-carry/cutlass-include.tar.gz ]; then
  tar -czf third_party/gpu-carry/cutlass-include.tar.gz -C third_party/cutlass include
fi
# FlashInfer's headers, its CCCL and CUTLASS's util headers (3.5 MiB; unpacked into third_party/ by
# scripts/gpu-check.sh), remade the same way.
if [ ! -f third_party/gpu-carry/flashinfer-include.tar.gz ] ||
   [ "third_party/wheels/$flashinfer_wheel" -nt third_party/gpu-carry/flashinfer-include.tar.gz ]; then
  tar -czf third_party/gpu-carry/flashinfer-include.tar.gz -C third_party flashinfer/include flashinfer/cccl \
    cutlass/util/include
fi
missing=()
for deb in "${debs[@]}"; do
  compgen -G "third_party/gpu-carry/debs/${deb}_*.deb" >/dev/null || missing+=("$deb")
done
if [ "${#missing[@]}" -gt 0 ]; then
  $sudo apt-get update -q
  (cd third_party/gpu-carry/debs && apt-get download "${missing[@]}")
fi
echo "setup.sh: GPU carry ready: $(du -sh third_party/gpu-carry | cut -f1) in third_party/gpu-carry"

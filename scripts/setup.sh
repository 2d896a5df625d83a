#!/usr/bin/env bash
# Installs the Debian 12 packages klinear builds and tests with, and the PyPI packages of the test
# oracles and clients (tiktoken for tests/io/k3_reference_encoder.py, openai for the server tests).
# Idempotent; uses sudo when not root.
set -euo pipefail
packages=(build-essential cmake pkg-config nlohmann-json3-dev libcli11-dev libpcre2-dev libopenblas-openmp-dev
          libgtest-dev libcpp-httplib-dev python3 python3-jinja2 python3-pip clang libclang-rt-14-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  $sudo apt-get install -y -q "${missing[@]}"
fi
if ! python3 -c "import tiktoken" 2>/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  # Debian 12's python3 is externally managed (PEP 668): pip needs --break-system-packages there.
  $sudo python3 -m pip install -q tiktoken 2>/dev/null || $sudo python3 -m pip install -q --break-system-packages tiktoken
fi
# The server tests drive klinear serve with the official OpenAI Python client (PyPI).
if ! python3 -c "import openai" 2>/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo python3 -m pip install -q openai 2>/dev/null || $sudo python3 -m pip install -q --break-system-packages openai
fi

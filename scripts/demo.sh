#!/usr/bin/env bash
# Sets up, builds, writes the demo model and generates text with it.
#
# The demo model has RANDOM weights: it exercises the whole pipeline (tokenizer, KDA, MLA, MoE,
# sampling) with the real 163,840-token Kimi vocabulary, but its text is gibberish. Point klinear
# at a real checkpoint directory for real output (see README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh klinear
preset=${1:-kimi-linear-demo}
# init puts the preset's tokenizer (K2's or K3's) into the directory. A model of another preset
# than the one there is written anew.
if ! grep -qs "\"$preset\"" demo-model/.preset; then
  rm -rf demo-model
  ./build/klinear init --preset "$preset" --out demo-model
  echo "\"$preset\"" > demo-model/.preset
fi
./build/klinear info --model demo-model | head -20
./build/klinear generate --model demo-model --prompt "The capital of France is" --max-tokens 24 \
  --temperature 0.8 --top-p 0.95 --seed 1

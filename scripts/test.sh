#!/usr/bin/env bash
# The test command (README): installs what it needs, builds everything (CUDA code is compiled
# whenever nvcc is present), and runs every test that this machine can run: the gpu-labelled
# tests only where a GPU answers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
labels=(-LE gpu)
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  labels=()
fi
cd build
ctest --output-on-failure -j"$(nproc)" "${labels[@]}" "$@"

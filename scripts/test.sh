#!/usr/bin/env bash
# The test command (README): installs what it needs, builds everything (CUDA code is compiled
# whenever nvcc is present), and runs every test that this machine can run: the gpu-labelled
# tests only where a GPU answers; among them the x86-64 release tarball (tests/test_package.py).
# With LATHE_AARCH64=1 (or =quick), then aarch64: the cross build, its tests under qemu-user, the
# byte comparison with x86-64 and the aarch64 tarball (scripts/test-aarch64.sh [--quick]).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
labels=(-LE gpu)
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  labels=()
fi
(cd build && ctest --output-on-failure -j"$(nproc)" "${labels[@]}" "$@")
case ${LATHE_AARCH64:-0} in
  1) bash scripts/test-aarch64.sh ;;
  quick) bash scripts/test-aarch64.sh --quick ;;
esac

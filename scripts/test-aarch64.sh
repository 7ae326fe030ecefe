#!/usr/bin/env bash
# lathe on aarch64 without an ARM machine: cross-builds lathe for aarch64 Linux (CPU only) with
# Debian's cross toolchain and runs it under qemu-user. scripts/test.sh calls it after the x86-64
# tests; it needs the x86-64 build in ./build (scripts/build.sh) for the byte comparison.
#
#   scripts/test-aarch64.sh [--quick]
#
# 1. Build: cmake/aarch64-linux-gnu.cmake into ./build-aarch64 (override: LATHE_AARCH64_BUILD_DIR),
#    the lathe binary and the C++ test binaries below.
# 2. C++ tests under qemu-user, every test of: core, io, tokenizer, data, ops (the CPU reference
#    ops), optim (CPU AdamW) and align (align's CPU kernels) (--quick: core, tokenizer, data).
# 3. Python end-to-end tests with LATHE_BIN set to the aarch64 lathe under qemu-user:
#    tokenizer parity with Hugging Face tokenizers on every shared tokenizer
#    (test_tokenizer_parity.py), prepare (test_prepare.py), the CPU training reference with its
#    exact-resume and same-bits tests (test_train.py -k 'resume or exact or bits'), convert
#    (test_convert.py) and the align stages terms and embed (test_align_terms.py,
#    test_align_embed.py -k 'cpu') (--quick: parity and prepare only).
# 4. The same inputs through both binaries, every output compared byte for byte
#    (scripts/compare-arches.sh: token files of every shared tokenizer, a trained tokenizer, CPU
#    checkpoints with a resume, convert, align terms and embed).
# 5. The aarch64 release tarball (scripts/package.sh) and its check (scripts/package-check.sh).
# Each step prints its time.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = --quick ] && quick=1
bash scripts/install-deps.sh --aarch64
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
build=${LATHE_AARCH64_BUILD_DIR:-build-aarch64}
if [ ! -x build/lathe ]; then
  echo "test-aarch64: error: no x86-64 build/lathe to compare with (run scripts/build.sh first)" >&2
  exit 2
fi
step() { echo "test-aarch64: $1 ($(($(date +%s) - t0)) s)"; }

cxx_tests=(core_tests io_tests tokenizer_tests data_tests ops_tests optim_tests align_tests)
py_tests=(tests/test_tokenizer_parity.py tests/test_prepare.py tests/test_train.py
  tests/test_convert.py tests/test_align_terms.py tests/test_align_embed.py)
if ((quick)); then
  cxx_tests=(core_tests tokenizer_tests data_tests)
  py_tests=(tests/test_tokenizer_parity.py tests/test_prepare.py)
fi

t0=$(date +%s)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake >/dev/null
ninja -C "$build" lathe "${cxx_tests[@]}"
step "cross build"

# The aarch64 lathe as a command: qemu-user with the cross sysroot's dynamic loader and glibc
# (the :arm64 multiarch libraries resolve through qemu's fallback to the real /usr/lib).
mkdir -p "$build/qemu"
# OPENBLAS_NUM_THREADS=1: OpenBLAS's thread pool hangs at start-up under qemu-user; lathe makes
# its BLAS single-threaded anyway (ops/cpu/gemm.cpp), so results are those of a native run.
cat >"$build/qemu/lathe" <<EOF
#!/bin/sh
OPENBLAS_NUM_THREADS=1 exec qemu-aarch64-static -L /usr/aarch64-linux-gnu "$PWD/$build/lathe" "\$@"
EOF
chmod +x "$build/qemu/lathe"
readelf -h "$build/lathe" | grep -q 'Machine: *AArch64' || {
  echo "test-aarch64: error: $build/lathe is not an aarch64 binary" >&2
  exit 1
}
"$build/qemu/lathe" --version

t0=$(date +%s)
for t in "${cxx_tests[@]}"; do
  s=$(date +%s)
  OPENBLAS_NUM_THREADS=1 qemu-aarch64-static -L /usr/aarch64-linux-gnu "$build/$t" --gtest_brief=1
  echo "test-aarch64: $t under qemu: $(($(date +%s) - s)) s"
done
step "C++ tests under qemu"

t0=$(date +%s)
for f in "${py_tests[@]}"; do
  s=$(date +%s)
  filter=()
  # The CPU training reference: its exact-resume and same-bits tests.
  [ "$f" = tests/test_train.py ] && filter=(-k 'resume or exact or bits')
  LATHE_BIN=$PWD/$build/qemu/lathe LATHE_SHARED_DIR=$PWD/../shared LATHE_BUILD_DIR=$PWD/$build \
    python3 -m pytest -q -x -rs -p no:cacheprovider "$f" "${filter[@]}"
  echo "test-aarch64: $f with the aarch64 lathe: $(($(date +%s) - s)) s"
done
step "Python end-to-end tests with the aarch64 lathe"

t0=$(date +%s)
bash scripts/compare-arches.sh "$PWD/build/lathe" "$PWD/$build/qemu/lathe" "$PWD/$build/compare"
step "x86-64 and aarch64 outputs compared"

t0=$(date +%s)
tarball=$(bash scripts/package.sh "$build" "$PWD/dist")
bash scripts/package-check.sh "$tarball" "$PWD/$build/package-check"
step "aarch64 tarball $tarball"

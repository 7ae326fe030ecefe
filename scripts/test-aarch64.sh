#!/usr/bin/env bash
# lathe on aarch64 without an ARM machine: cross-builds lathe for aarch64 Linux (CPU only) with
# Debian's cross toolchain and a private sysroot of :arm64 libraries, and runs it under qemu-user.
# scripts/test.sh calls it after the x86-64 tests (LATHE_AARCH64=1); it needs the x86-64 build in
# ./build (scripts/build.sh) for the byte comparison.
#
#   scripts/test-aarch64.sh [--quick]
#
# 1. The sysroot (scripts/install-deps.sh --aarch64: LATHE_AARCH64_SYSROOT, by default
#    ~/.cache/lathe/aarch64-sysroot) and the build: cmake/aarch64-linux-gnu.cmake into
#    ./build-aarch64 (override: LATHE_AARCH64_BUILD_DIR), the lathe binary and the C++ test
#    binaries below. Then two checks that the sysroot is what the build used: no compiled file
#    read a header from the machine's /usr/include or /usr/local, and every library of the lathe
#    binary resolves, under qemu-user, inside the sysroot or the cross toolchain's glibc.
# 2. C++ tests under qemu-user, every test of: core, io, tokenizer, data, ops (the CPU reference
#    ops), optim (CPU AdamW) and align (align's CPU kernels) (--quick: core, tokenizer, data).
# 3. Python end-to-end tests with LATHE_BIN set to the aarch64 lathe under qemu-user:
#    tokenizer parity with Hugging Face tokenizers on every shared tokenizer
#    (test_tokenizer_parity.py), prepare (test_prepare.py), the CPU training reference with its
#    exact-resume and same-bits tests (test_train.py -k 'resume or exact or bits'), convert
#    (test_convert.py) and the align stages terms and embed (test_align_terms.py;
#    test_align_embed.py less its two tests of the vectors' meaning, whose outputs step 4
#    compares byte for byte) (--quick: parity and prepare only).
# 4. The same inputs through both binaries, every output compared byte for byte
#    (scripts/compare-arches.sh: token files of every shared tokenizer, a trained tokenizer, CPU
#    checkpoints with a resume, convert, align terms and embed).
# 5. The aarch64 release tarball (scripts/package.sh) and its check (scripts/package-check.sh).
# Each piece prints its time.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = --quick ] && quick=1
export LATHE_AARCH64_SYSROOT=${LATHE_AARCH64_SYSROOT:-$HOME/.cache/lathe/aarch64-sysroot}
sysroot=$LATHE_AARCH64_SYSROOT
triple=aarch64-linux-gnu
bash scripts/install-deps.sh --aarch64
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
build=$(realpath -m "${LATHE_AARCH64_BUILD_DIR:-build-aarch64}")
if [ ! -x build/lathe ]; then
  echo "test-aarch64: error: no x86-64 build/lathe to compare with (run scripts/build.sh first)" >&2
  exit 2
fi
T0=$(date +%s)
t0=$T0
step() { echo "test-aarch64: $1: $(($(date +%s) - t0)) s"; }

cxx_tests=(core_tests io_tests tokenizer_tests data_tests ops_tests optim_tests align_tests)
py_tests=(tests/test_tokenizer_parity.py tests/test_prepare.py tests/test_train.py
  tests/test_convert.py tests/test_align_terms.py tests/test_align_embed.py)
if ((quick)); then
  cxx_tests=(core_tests tokenizer_tests data_tests)
  py_tests=(tests/test_tokenizer_parity.py tests/test_prepare.py)
fi

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DLATHE_AARCH64_SYSROOT="$sysroot" >/dev/null
ninja -C "$build" lathe "${cxx_tests[@]}"
step "cross build"

# The aarch64 programs run under qemu-user with the cross toolchain's dynamic loader (-L), the
# sysroot's libraries and the cross toolchain's glibc, libstdc++ and libgomp (LD_LIBRARY_PATH,
# which qemu hands to the aarch64 program).
# OPENBLAS_NUM_THREADS=1: OpenBLAS's thread pool hangs at start-up under qemu-user; lathe makes
# its BLAS single-threaded anyway (ops/cpu/gemm.cpp), so results are those of a native run.
libpath=$sysroot/usr/lib/$triple:$sysroot/lib/$triple:/usr/$triple/lib
qemu() {
  OPENBLAS_NUM_THREADS=1 LD_LIBRARY_PATH=$libpath qemu-aarch64-static -L /usr/$triple "$@"
}
mkdir -p "$build/qemu"
cat >"$build/qemu/lathe" <<EOF
#!/bin/sh
OPENBLAS_NUM_THREADS=1 LD_LIBRARY_PATH='$libpath' exec qemu-aarch64-static -L /usr/$triple '$build/lathe' "\$@"
EOF
chmod +x "$build/qemu/lathe"
readelf -h "$build/lathe" | grep -q 'Machine: *AArch64' || {
  echo "test-aarch64: error: $build/lathe is not an aarch64 binary" >&2
  exit 1
}

t0=$(date +%s)
# Headers: every compiled file's dependencies (ninja's deps log) lie in the source or build tree,
# the sysroot or the cross toolchain; the machine's /usr/include holds its amd64 -dev headers.
outside=$(ninja -C "$build" -t deps | sed -n 's/^ \{4\}//p' | sort -u |
  grep -E '^/usr/(include|local)/' || true)
if [ -n "$outside" ]; then
  echo "test-aarch64: FAIL: the cross build read headers from the machine, not the sysroot:" >&2
  echo "$outside" | head -20 >&2
  exit 1
fi
# Libraries at link time: no link line names the machine's multiarch folder.
outside=$(grep -oE "(^|[ :;=])(-L)?/usr/lib/$triple[^ ]*" "$build/build.ninja" | sort -u || true)
if [ -n "$outside" ]; then
  echo "test-aarch64: FAIL: the cross build links libraries of the machine, not the sysroot:" >&2
  echo "$outside" | head -20 >&2
  exit 1
fi
# Libraries at run time: the aarch64 dynamic loader's own listing under qemu-user.
listing=$(qemu /usr/$triple/lib/ld-linux-aarch64.so.1 --list "$build/lathe")
bad=$(echo "$listing" | awk '$2 == "=>" { print }' |
  grep -vE "=> ($sysroot/|/usr/$triple/lib/)" || true)
if [ -n "$bad" ]; then
  echo "test-aarch64: FAIL: libraries of the aarch64 lathe resolve outside the sysroot:" >&2
  echo "$bad" >&2
  exit 1
fi
"$build/qemu/lathe" --version
step "sysroot checks ($(echo "$listing" | grep -c '=>') libraries)"

# A death test in the "threadsafe" style re-executes its own binary, which an aarch64 binary under
# qemu-user cannot do where binfmt_misc does not name qemu for aarch64 (containers): those run on
# x86-64 only. The "fast" style (fork alone) runs under qemu.
declare -A gtest_filter=(
  [ops_tests]=-Linear.Fp8PrecisionStopsNamingOpRoleAndBackend
)
t0=$(date +%s)
for t in "${cxx_tests[@]}"; do
  s=$(date +%s)
  qemu "$build/$t" --gtest_brief=1 ${gtest_filter[$t]:+--gtest_filter=${gtest_filter[$t]}}
  echo "test-aarch64: $t under qemu: $(($(date +%s) - s)) s"
done
step "C++ tests under qemu"

t0=$(date +%s)
for f in "${py_tests[@]}"; do
  s=$(date +%s)
  filter=()
  # The CPU training reference: its exact-resume and same-bits tests.
  [ "$f" = tests/test_train.py ] && filter=(-k 'resume or exact or bits')
  # align embed: its bad-input errors. Its vectors (GloVe and skip-gram, one thread)
  # are compared byte for byte with x86-64's below, where the tests of their meaning run (8 of
  # the 9 minutes this file took under qemu).
  [ "$f" = tests/test_align_embed.py ] && filter=(-k 'not mean_something')
  LATHE_BIN=$build/qemu/lathe LATHE_SHARED_DIR=${LATHE_SHARED_DIR:-$PWD/../shared} \
    LATHE_BUILD_DIR=$build python3 -m pytest -q -x -rs -p no:cacheprovider "$f" "${filter[@]}"
  echo "test-aarch64: $f with the aarch64 lathe: $(($(date +%s) - s)) s"
done
step "Python end-to-end tests with the aarch64 lathe"

t0=$(date +%s)
bash scripts/compare-arches.sh "$PWD/build/lathe" "$build/qemu/lathe" "$build/compare"
step "x86-64 and aarch64 outputs compared"

t0=$(date +%s)
# The tarball's libraries: the sysroot's, and libstdc++/libgcc_s/libgomp of the cross toolchain.
tarball=$(LATHE_PACKAGE_LIBDIRS=$libpath bash scripts/package.sh "$build" "$build/dist")
bash scripts/package-check.sh "$tarball" "$build/package-check"
step "aarch64 tarball $tarball"
echo "test-aarch64: all: $(($(date +%s) - T0)) s"

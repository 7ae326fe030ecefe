#!/usr/bin/env bash
# Packs what a run on the lent GPU machine needs into one archive, and unpacks it there.
#
# The GPU machine has the CUDA toolkit, cuDNN and NCCL, but not the Debian -dev packages lathe
# builds against (PCRE2, utf8proc, simdjson, yaml-cpp, CLI11, fmt, OpenBLAS), and a device call
# is short; so the binaries are built here (nvcc compiles sm_90a without a GPU) and travel with the
# shared libraries they need that the GPU machine lacks. CUDA's own libraries (cudart, cuBLASLt,
# cuDNN, NVRTC) are the GPU machine's: the same CUDA 13.0 major.minor as here.
#
#   scripts/gpu-bundle.sh pack [BUILD_DIR]   here: touch the sources changed since the last pack began
#                                            (.carry/gpu-bundle.stamp), ninja lathe, the *_gpu_tests
#                                            and cuda_ops_bench in BUILD_DIR
#                                            (default build; a missing target stops it),
#                                            strip copies, write .carry/gpu-bundle.tgz (git-ignored;
#                                            name .carry in the run tool's carry list)
#   scripts/gpu-bundle.sh unpack DIR [ARCHIVE]  there: unpack ARCHIVE (default the bundle) into DIR;
#                                            prints the LD_LIBRARY_PATH to export (DIR/lib)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# Everything scripts/gpu-check.sh runs; a build without one of them cannot pack.
targets=(lathe ops_gpu_tests model_gpu_tests align_gpu_tests dist_gpu_tests dist_two_gpu_tests optim_gpu_tests infer_gpu_tests run_gpu_tests
    infer_two_gpu_tests
    cuda_ops_bench all_reduce_bench gemm_algo_search)

die() {
    echo "gpu-bundle: $*" >&2
    exit 1
}

pack() {
    local build=${1:-$root/build}
    [[ -f $build/build.ninja ]] || die "$build is not a configured build folder"
    local have=("${targets[@]}") t
    for t in "${have[@]}"; do
        ninja -C "$build" -t query "$t" >/dev/null 2>&1 ||
            die "$build has no target $t (configure it where nvcc is, with tests on)"
    done
    # A source edited while its object compiled leaves an object older in content but newer in
    # time than the source, which ninja keeps. Every source changed since the last pack began is
    # touched, so its object is compiled again (ccache returns the same object when the content
    # is the one compiled).
    local stamp=$root/.carry/gpu-bundle.stamp
    mkdir -p "$root/.carry"
    if [[ -f $stamp ]]; then
        find "$root/src" "$root/bench" -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' \
            -o -name '*.cuh' \) -newer "$stamp" -exec touch {} +
    fi
    touch "$stamp"
    ninja -C "$build" -j"$(nproc)" "${have[@]}" || die "the build failed"
    local stage
    stage=$(mktemp -d)
    mkdir -p "$stage/bin" "$stage/lib"
    for t in "${have[@]}"; do
        cp "$build/$t" "$stage/bin/"
        strip "$stage/bin/$t"
    done
    # Shared libraries from the Debian packages; the C/C++ runtime and CUDA's are the GPU
    # machine's own (newer glibc and libstdc++ run binaries built against older ones).
    ldd "${have[@]/#/$build/}" | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
        case $(basename "$lib") in
            libc.so* | libm.so* | libstdc++* | libgcc_s* | ld-linux* | libpthread* | libdl.so* | \
                librt.so* | libcuda.so* | libcudart* | libcublas* | libcudnn* | libnvrtc* | \
                libnccl* | libnvJitLink*) ;;
            *) cp -L "$lib" "$stage/lib/" ;;
        esac
    done
    mkdir -p "$root/.carry"
    tar -C "$stage" -czf "$root/.carry/gpu-bundle.tgz" bin lib
    rm -rf "$stage"
    ls -la "$root/.carry/gpu-bundle.tgz"
}

unpack() {
    local dir=${1:?usage: gpu-bundle.sh unpack DIR [ARCHIVE]}
    local archive=${2:-$root/.carry/gpu-bundle.tgz}
    mkdir -p "$dir"
    tar -C "$dir" -xzf "$archive"
    echo "$dir/lib"
}

case ${1:-} in
    pack) shift; pack "$@" ;;
    unpack) shift; unpack "$@" ;;
    *) die "usage: gpu-bundle.sh pack [BUILD_DIR] | unpack DIR [ARCHIVE]" ;;
esac

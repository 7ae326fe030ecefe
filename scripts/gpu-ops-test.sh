#!/usr/bin/env bash
# Builds the ops library with its CUDA tests (src/ops/cuda/*_test.cu) without CMake, and runs them.
#
# Why not CMake: the top-level CMakeLists.txt configures every module and so needs packages (PCRE2,
# utf8proc, simdjson, yaml-cpp, CLI11, GoogleTest, fmt) that the GPU test machine does not have. The
# ops and their tests need only fmt (used header-only here) and GoogleTest (compiled from source),
# which `prepare` copies from this machine into .carry/deps (ignored by git) for the trip.
#
#   scripts/gpu-ops-test.sh prepare        here: fill .carry/deps; build .carry/prebuilt/ops_gpu_tests
#                                          with this same script as a fallback binary
#   scripts/gpu-ops-test.sh build [DIR]    compile into DIR (default build-gpu-direct), ninja -j$(nproc)
#   scripts/gpu-ops-test.sh run OUT        on the GPU machine: environment report, build (falling back
#                                          to the prebuilt binary if the build fails), the tests, then
#                                          compute-sanitizer memcheck and racecheck on the tests whose
#                                          kernels use shared memory, then bench/cuda_ops_bench.cu
#                                          (per-op times against their floors); logs under OUT
#
# Compiler flags match the CMake build (C++20, -O2, sm_90a, LATHE_HAVE_CUDA=1) except that the CPU
# reference runs its plain loops (LATHE_NO_BLAS) and fmt is header-only (FMT_HEADER_ONLY).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
deps=$root/.carry/deps
prebuilt=$root/.carry/prebuilt

die() {
    echo "gpu-ops-test: $*" >&2
    exit 1
}

cuda_root() {
    local nvcc
    nvcc=$(command -v nvcc) || die "nvcc not on PATH (add the CUDA toolkit's bin directory)"
    (cd "$(dirname "$nvcc")/.." && pwd)
}

prepare() {
    local gtest_src=/usr/src/googletest/googletest
    [[ -d /usr/include/fmt ]] || die "/usr/include/fmt missing (install libfmt-dev)"
    [[ -f $gtest_src/src/gtest-all.cc ]] || die "$gtest_src missing (install googletest)"
    rm -rf "$deps" && mkdir -p "$deps/fmt" "$deps/googletest"
    cp -r /usr/include/fmt "$deps/fmt/"
    cp -r "$gtest_src/include" "$gtest_src/src" "$deps/googletest/"
    build "$root/build-gpu-direct" || die "the build failed here"
    mkdir -p "$prebuilt"
    cp "$root/build-gpu-direct/ops_gpu_tests" "$prebuilt/"
    strip "$prebuilt/ops_gpu_tests"
    du -sh "$deps" "$prebuilt"
}

# Writes DIR/build.ninja for the ops library sources, the CUDA tests and GoogleTest, and runs ninja.
build() {
    local dir=${1:-$root/build-gpu-direct}
    local cuda
    cuda=$(cuda_root)
    [[ -f $deps/googletest/src/gtest-all.cc ]] || die "$deps is empty: run 'prepare' first"
    mkdir -p "$dir"
    local defs="-DNDEBUG -DFMT_HEADER_ONLY -DLATHE_NO_BLAS -DLATHE_HAVE_CUDA=1"
    defs+=" -DLATHE_VERSION_STRING=\\\"gpu-ops-test\\\""
    local incs="-I$root/src -I$deps/fmt -I$deps/googletest/include -I$deps/googletest"
    local gencode="-gencode=arch=compute_90a,code=sm_90a"
    # CUDA attention needs the cuDNN frontend headers (scripts/install-deps.sh unpacks them into
    # .deps/cudnn-frontend, which travels with the tree) and libcudnn 9 (with the toolkit, or the
    # distribution's packages under /usr/{include,lib}/x86_64-linux-gnu). Without them the ops
    # build without it, and the attention tests say so and skip.
    local fe=${LATHE_CUDNN_FRONTEND_DIR:-$root/.deps/cudnn-frontend}
    local cudnn_libs="" nvcc_extra=""
    local cudnn_h
    cudnn_h=$(ls "$cuda"/include/cudnn.h /usr/include/x86_64-linux-gnu/cudnn.h /usr/include/cudnn.h 2>/dev/null | head -1)
    if [[ -f $fe/include/cudnn_frontend.h && -n $cudnn_h ]]; then
        nvcc_extra="-DLATHE_HAVE_CUDNN_FRONTEND=1 -DCUDNN_FRONTEND_SKIP_JSON_LIB=1 -isystem $fe/include -isystem $(dirname "$cudnn_h")"
        cudnn_libs="-L$cuda/lib -L$cuda/lib64 -lcudnn -lnvrtc"  # NVRTC: the frontend's run-time compiled engines
        echo "gpu-ops-test: CUDA attention through cuDNN ($cudnn_h, frontend $fe/include)"
    else
        echo "gpu-ops-test: WARNING: building without CUDA attention (cuDNN frontend headers in $fe/include: $([[ -f $fe/include/cudnn_frontend.h ]] && echo found || echo missing); cudnn.h: ${cudnn_h:-missing})"
    fi
    {
        echo "rule cxx"
        echo "  command = g++ -std=c++20 -O2 -fopenmp -Wall -Wextra -Wno-unused-parameter $defs $incs -I$cuda/include -MD -MF \$out.d -c \$in -o \$out"
        echo "  depfile = \$out.d"
        echo "  description = CXX \$in"
        echo "rule nvcc"
        echo "  command = nvcc -std=c++20 --expt-relaxed-constexpr -O2 $gencode -diag-suppress 20208 $defs $incs $nvcc_extra -MD -MF \$out.d -c \$in -o \$out"
        echo "  depfile = \$out.d"
        echo "  description = NVCC \$in"
        echo "rule link"
        echo "  command = nvcc $gencode -o \$out \$in -lcublasLt $cudnn_libs -lgomp -lpthread -Xlinker -rpath=$cuda/lib64:$cuda/lib"
        echo "  description = LINK \$out"
        local lib=() tests=()
        local f obj
        for f in "$root"/src/core/*.cpp "$root"/src/ops/*.cpp "$root"/src/ops/cpu/*.cpp; do
            [[ $f == *_test.cpp ]] && continue
            obj=obj/${f#"$root"/}.o
            echo "build $obj: cxx $f"
            lib+=("$obj")
        done
        for f in "$root"/src/ops/cuda/*.cu "$root"/bench/cuda_ops_bench.cu; do
            obj=obj/${f#"$root"/}.o
            echo "build $obj: nvcc $f"
            case $f in
                *_test.cu) tests+=("$obj") ;;
                */bench/*) ;;
                *) lib+=("$obj") ;;
            esac
        done
        for f in gtest-all gtest_main; do
            echo "build obj/gtest/$f.o: cxx $deps/googletest/src/$f.cc"
            tests+=("obj/gtest/$f.o")
        done
        echo "build ops_gpu_tests: link ${lib[*]} ${tests[*]}"
        echo "build cuda_ops_bench: link ${lib[*]} obj/bench/cuda_ops_bench.cu.o"
    } > "$dir/build.ninja"
    ninja -C "$dir" -j"$(nproc)" ops_gpu_tests
}

run() {
    local out=${1:?usage: gpu-ops-test.sh run OUT}
    mkdir -p "$out"
    local cuda
    cuda=$(cuda_root)
    export LD_LIBRARY_PATH="$cuda/lib64:$cuda/lib:${LD_LIBRARY_PATH:-}"
    {
        date -u
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
            --format=csv
        nvcc --version | tail -2
        g++ --version | head -1
        nproc
    } > "$out/env.txt" 2>&1
    cat "$out/env.txt"

    local bin=$root/build-gpu-direct/ops_gpu_tests how="built here"
    local t0=$SECONDS
    if ! build "$root/build-gpu-direct" > "$out/build.log" 2>&1; then
        echo "gpu-ops-test: the build failed (tail of $out/build.log below); using the prebuilt binary"
        tail -30 "$out/build.log"
        bin=$prebuilt/ops_gpu_tests how="prebuilt"
    fi
    echo "binary: $how ($((SECONDS - t0)) s to build)"

    local status=0
    t0=$SECONDS
    "$bin" --gtest_output="xml:$out/gtest.xml" > "$out/tests.log" 2>&1 || status=$?
    echo "tests: exit $status in $((SECONDS - t0)) s"
    grep -E "^\[  (FAILED|PASSED) |^\[==========\]|Failure|error|FAILED" "$out/tests.log" | head -80

    local sanitizer
    sanitizer=$(command -v compute-sanitizer || echo "$cuda/bin/compute-sanitizer")
    if [[ -x $sanitizer ]]; then
        t0=$SECONDS
        # Death tests re-run the binary and abort on purpose: leave them out.
        timeout 120 "$sanitizer" --tool memcheck --leak-check no --error-exitcode 9 \
            "$bin" --gtest_filter='-*DeathTest*:*Rejects*:*TrainingShape*:*Deterministic*' > "$out/memcheck.log" 2>&1
        echo "memcheck: exit $? in $((SECONDS - t0)) s: $(grep -E 'ERROR SUMMARY' "$out/memcheck.log" | tail -1)"
        t0=$SECONDS
        timeout 60 "$sanitizer" --tool racecheck --error-exitcode 9 "$bin" \
            --gtest_filter='CudaLmHeadCrossEntropy.*:CudaEmbedding.*:CudaGradNorm.*' \
            > "$out/racecheck.log" 2>&1
        echo "racecheck: exit $? in $((SECONDS - t0)) s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/racecheck.log" | tail -1)"
    fi
    local bench=$root/build-gpu-direct/cuda_ops_bench
    if [[ $how == "built here" ]] && ninja -C "$root/build-gpu-direct" cuda_ops_bench >> "$out/build.log" 2>&1; then
        timeout 150 "$bench" > "$out/bench.md" 2>&1
        echo "bench: exit $?"
        cat "$out/bench.md"
    fi
    return $status
}

case ${1:-} in
    prepare) prepare ;;
    build) build "${2:-$root/build-gpu-direct}" ;;
    run) run "${2:-}" ;;
    *) die "usage: gpu-ops-test.sh prepare | build [DIR] | run OUT" ;;
esac

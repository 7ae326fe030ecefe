# Cross-compiling lathe for aarch64 Linux on an x86-64 Debian machine (CPU only: no CUDA).
#
# Needs Debian's cross toolchain and the :arm64 -dev packages lathe links, through multiarch
# (scripts/install-deps.sh --aarch64 installs both):
#   cmake -S . -B build-aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
# The binaries run here under qemu-user (scripts/test-aarch64.sh). A native aarch64 build (GH200)
# needs no toolchain file: docs/GH200.md.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(LATHE_CROSS_TRIPLE aarch64-linux-gnu)

set(CMAKE_C_COMPILER ${LATHE_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${LATHE_CROSS_TRIPLE}-g++)
set(CMAKE_LIBRARY_ARCHITECTURE ${LATHE_CROSS_TRIPLE})

# Headers and libraries come from the multiarch folders (/usr/include/aarch64-linux-gnu,
# /usr/lib/aarch64-linux-gnu) beside the architecture-independent /usr/include; programs run during
# the build (protoc) are the host's.
set(CMAKE_FIND_ROOT_PATH /usr/${LATHE_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/${LATHE_CROSS_TRIPLE}/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

# Test executables (gtest_discover_tests lists each binary's tests at build time) and
# try_run results run under qemu-user.
# OPENBLAS_NUM_THREADS=1: OpenBLAS's thread pool hangs at start-up under qemu-user (lathe runs
# its BLAS single-threaded anyway).
find_program(LATHE_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64 REQUIRED)
set(CMAKE_CROSSCOMPILING_EMULATOR
    env;OPENBLAS_NUM_THREADS=1;${LATHE_QEMU_AARCH64};-L;/usr/${LATHE_CROSS_TRIPLE})

# No CUDA in a cross build: the aarch64 CUDA backend is built natively with the sbsa toolkit.
set(LATHE_CUDA OFF CACHE BOOL "" FORCE)

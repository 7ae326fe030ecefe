# Cross-compiling lathe for aarch64 Linux on an x86-64 Debian machine (CPU only: no CUDA).
#
#   scripts/install-deps.sh --aarch64
#   cmake -S . -B build-aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
#
# The compiler is Debian's cross toolchain (crossbuild-essential-arm64), with its own aarch64 glibc,
# libstdc++ and libgomp in /usr/aarch64-linux-gnu. Every other library lathe links (yaml-cpp, fmt,
# simdjson, PCRE2, utf8proc, zstd, zlib, OpenBLAS, protobuf, GoogleTest, the header-only ones) comes
# from a private sysroot of unpacked :arm64 Debian packages that install-deps.sh --aarch64 makes:
# LATHE_AARCH64_SYSROOT (cache or environment), by default ~/.cache/lathe/aarch64-sysroot. Nothing
# is installed through multiarch, so the machine's amd64 -dev packages stay as they are, and
# nothing from the machine's /usr/include or /usr/lib reaches the build (scripts/test-aarch64.sh
# checks the headers and libraries used). Programs run during the build (protoc) are the host's.
# The binaries run here under qemu-user (scripts/test-aarch64.sh). A native aarch64 build (GH200)
# needs no toolchain file: docs/GH200.md.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(LATHE_CROSS_TRIPLE aarch64-linux-gnu)

set(CMAKE_C_COMPILER ${LATHE_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${LATHE_CROSS_TRIPLE}-g++)
set(CMAKE_LIBRARY_ARCHITECTURE ${LATHE_CROSS_TRIPLE})

if(NOT LATHE_AARCH64_SYSROOT)
  if(DEFINED ENV{LATHE_AARCH64_SYSROOT})
    set(LATHE_AARCH64_SYSROOT "$ENV{LATHE_AARCH64_SYSROOT}")
  else()
    set(LATHE_AARCH64_SYSROOT "$ENV{HOME}/.cache/lathe/aarch64-sysroot")
  endif()
endif()
set(LATHE_AARCH64_SYSROOT "${LATHE_AARCH64_SYSROOT}" CACHE PATH
    "Unpacked :arm64 libraries for the aarch64 cross build (scripts/install-deps.sh --aarch64)")
# try_compile projects read this file again: they get the same sysroot.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES LATHE_AARCH64_SYSROOT)
if(NOT EXISTS "${LATHE_AARCH64_SYSROOT}/.lathe-packages")
  message(FATAL_ERROR "no aarch64 sysroot at ${LATHE_AARCH64_SYSROOT}: run "
                      "scripts/install-deps.sh --aarch64 (or set LATHE_AARCH64_SYSROOT)")
endif()
set(LATHE_AARCH64_LIBDIR ${LATHE_AARCH64_SYSROOT}/usr/lib/${LATHE_CROSS_TRIPLE})

# find_package/find_library/find_path look in the sysroot and the cross toolchain's folder only;
# programs come from the host.
set(CMAKE_FIND_ROOT_PATH ${LATHE_AARCH64_SYSROOT} /usr/${LATHE_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# pkg-config reads the sysroot's .pc files and prefixes their paths with it.
set(ENV{PKG_CONFIG_LIBDIR}
    "${LATHE_AARCH64_LIBDIR}/pkgconfig:${LATHE_AARCH64_SYSROOT}/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
set(ENV{PKG_CONFIG_SYSROOT_DIR} "${LATHE_AARCH64_SYSROOT}")

# The sysroot's headers ahead of the compiler's fallback /usr/include (which holds the host's
# -dev headers), for the sources that include them without a CMake target naming the folder
# (cblas.h, found through __has_include).
set(CMAKE_C_STANDARD_INCLUDE_DIRECTORIES
    ${LATHE_AARCH64_SYSROOT}/usr/include/${LATHE_CROSS_TRIPLE} ${LATHE_AARCH64_SYSROOT}/usr/include)
set(CMAKE_CXX_STANDARD_INCLUDE_DIRECTORIES ${CMAKE_C_STANDARD_INCLUDE_DIRECTORIES})
# The linker: the sysroot's libraries before the machine's multiarch folder, and the libraries
# they need in turn (libopenblas -> libgfortran) from the sysroot too.
set(LATHE_AARCH64_LINK_FLAGS
    "-L${LATHE_AARCH64_LIBDIR} -L${LATHE_AARCH64_SYSROOT}/lib/${LATHE_CROSS_TRIPLE} -Wl,-rpath-link,${LATHE_AARCH64_LIBDIR}:${LATHE_AARCH64_SYSROOT}/lib/${LATHE_CROSS_TRIPLE}")
set(CMAKE_EXE_LINKER_FLAGS_INIT "${LATHE_AARCH64_LINK_FLAGS}")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "${LATHE_AARCH64_LINK_FLAGS}")
set(CMAKE_MODULE_LINKER_FLAGS_INIT "${LATHE_AARCH64_LINK_FLAGS}")

# Test executables (gtest_discover_tests lists each binary's tests at build time) and try_run
# results run under qemu-user: the cross toolchain's dynamic loader (-L), the sysroot's libraries
# and the cross toolchain's glibc, libstdc++ and libgomp through LD_LIBRARY_PATH (which qemu hands
# to the aarch64 program; named, so that a machine's multiarch /lib/aarch64-linux-gnu, which qemu
# also shows the program, never stands in for them).
# OPENBLAS_NUM_THREADS=1: OpenBLAS's thread pool hangs at start-up under qemu-user (lathe runs
# its BLAS single-threaded anyway).
find_program(LATHE_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64 REQUIRED)
set(CMAKE_CROSSCOMPILING_EMULATOR
    env;OPENBLAS_NUM_THREADS=1;LD_LIBRARY_PATH=${LATHE_AARCH64_LIBDIR}:${LATHE_AARCH64_SYSROOT}/lib/${LATHE_CROSS_TRIPLE}:/usr/${LATHE_CROSS_TRIPLE}/lib;${LATHE_QEMU_AARCH64};-L;/usr/${LATHE_CROSS_TRIPLE})

# No CUDA in a cross build: the aarch64 CUDA backend is built natively with the sbsa toolkit.
set(LATHE_CUDA OFF CACHE BOOL "" FORCE)

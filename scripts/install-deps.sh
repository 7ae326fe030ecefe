#!/usr/bin/env bash
# Installs what lathe needs to build and test on a fresh Debian/Ubuntu machine: the -dev packages
# it links, the Debian dictionaries it uses as embedded default corpora, and the Python packages
# its reference tests compare against. Idempotent and quick when everything is there already.
#
#   scripts/install-deps.sh            what the native build and its tests need
#   scripts/install-deps.sh --aarch64  that, plus the aarch64 cross build's (scripts/test-aarch64.sh):
#                                      Debian's cross toolchain, qemu-user, and a private sysroot of
#                                      the :arm64 libraries lathe links (below)
set -euo pipefail
aarch64=0
[ "${1:-}" = --aarch64 ] && aarch64=1

DEB_PACKAGES=(
  build-essential cmake ninja-build pkg-config ccache git python3 python3-pip
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libfmt-dev libpcre2-dev libutf8proc-dev
  libzstd-dev zlib1g-dev libsimdjson-dev libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev zstd clang-format libopenmpi-dev openmpi-bin
  libprotobuf-dev protobuf-compiler libboost-dev
  # libcpp-httplib-dev: the HTTP server of `lathe serve` (header-only).
  libcpp-httplib-dev
  # patchelf: scripts/package.sh points the tarball's binary and libraries at its own lib/.
  patchelf
  # chromium: tests/test_report.py renders the page of `lathe report` headless to a PNG.
  chromium
  dict-gcide dict-foldoc dict-freedict-deu-eng dict-freedict-fra-eng dict-freedict-jpn-eng
  dict-freedict-eng-rus dict-freedict-ara-eng dict-freedict-eng-hin dict-freedict-ell-eng
)
# torch: transformers' model classes need it, and the runtime-parity tests load lathe's converted
# checkpoints with them (tests/test_convert.py, tests/test_align_map_apply.py).
# tensorboard: tests/test_tensorboard.py reads lathe's event files back with its EventAccumulator.
# openai: tests/test_serve.py talks to `lathe serve` through the OpenAI Python client.
# lm_eval, accelerate (its HF backend imports it): tests/test_eval_tasks.py scores the same tasks
# with lm-evaluation-harness; tenacity (its API models import it): tests/test_lm_eval_serve.py
# scores them through `lathe serve` with lm_eval's local-completions model.
PY_PACKAGES=(tokenizers numpy jinja2 pytest safetensors zstandard transformers torch tensorboard openai
  lm_eval accelerate tenacity)

# The aarch64 cross build (cmake/aarch64-linux-gnu.cmake, CPU only): Debian's cross toolchain (its
# own aarch64 glibc, libstdc++ and libgomp in /usr/aarch64-linux-gnu) and qemu-user, both native
# packages. No MPI: the cross build runs single-process tests.
if ((aarch64)); then
  DEB_PACKAGES+=(crossbuild-essential-arm64 qemu-user-static)
fi

missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: apt-get install ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The aarch64 libraries lathe links live in a private sysroot, never installed through multiarch:
# some of their -dev packages (libyaml-cpp-dev, libsimdjson-dev) are not "Multi-Arch: same", and
# apt would remove their amd64 twins that the native build needs. `apt-get download` fetches the
# :arm64 .deb files (which needs arm64 among dpkg's architectures for the package lists; that adds
# the lists, installs nothing) and `dpkg-deb -x` unpacks them into
# ${LATHE_AARCH64_SYSROOT:-~/.cache/lathe/aarch64-sysroot}, which cmake/aarch64-linux-gnu.cmake
# reads. Each -dev package comes with the libraries its .so links point at; OpenBLAS needs
# libgfortran5. glibc, libstdc++, libgcc_s and libgomp are the cross toolchain's.
AARCH64_SYSROOT_PACKAGES=(
  libyaml-cpp-dev libyaml-cpp0.7 libfmt-dev libfmt9
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libutf8proc-dev libutf8proc2 libzstd-dev libzstd1 zlib1g-dev zlib1g
  libsimdjson-dev libsimdjson14 libgtest-dev libgmock-dev
  libopenblas-dev libopenblas-pthread-dev libopenblas0 libopenblas0-pthread libgfortran5
  libprotobuf-dev libprotobuf32 libprotobuf-lite32 libboost1.74-dev
  libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libssl3 libbrotli-dev libbrotli1
)
# Architecture-independent header-only packages (CMake config files under usr/share/cmake).
AARCH64_SYSROOT_ALL_PACKAGES=(nlohmann-json3-dev libcli11-dev)
aarch64_sysroot() {
  local sysroot=$1 SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "install-deps: dpkg --add-architecture arm64 (package lists only; nothing arm64 is installed)"
    $SUDO dpkg --add-architecture arm64
    $SUDO apt-get update -qq
  fi
  local names=("${AARCH64_SYSROOT_PACKAGES[@]/%/:arm64}" "${AARCH64_SYSROOT_ALL_PACKAGES[@]}")
  # The stamp: every package and the version apt would fetch; the sysroot is rebuilt when it changes.
  local want
  want=$(apt-cache show --no-all-versions "${names[@]}" | sed -n 's/^\(Package\|Version\): //p')
  if [ "$(cat "$sysroot/.lathe-packages" 2>/dev/null)" = "$want" ]; then
    return
  fi
  echo "install-deps: aarch64 sysroot ($((${#names[@]})) packages) -> $sysroot"
  local tmp
  tmp=$(mktemp -d "${sysroot%/}.XXXXXX")
  (cd "$tmp" && apt-get download -qq "${names[@]}" 2>/dev/null) || {
    echo "install-deps: error: apt-get download of the arm64 packages failed (try apt-get update)" >&2
    rm -rf "$tmp"
    exit 1
  }
  mkdir -p "$tmp/root"
  for deb in "$tmp"/*.deb; do
    dpkg-deb -x "$deb" "$tmp/root"
  done
  # Absolute symbolic links (usr/lib/<triple>/libz.so -> /lib/<triple>/libz.so.1.2.13) point
  # into the sysroot instead of the machine's root.
  local link target
  while IFS= read -r -d '' link; do
    target=$(readlink "$link")
    ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$tmp/root$target")" "$link"
  done < <(find "$tmp/root" -type l -lname '/*' -print0)
  # What update-alternatives does for OpenBLAS on an installed system: the generic BLAS names and
  # cblas.h point at the pthread variant.
  local lib=$tmp/root/usr/lib/aarch64-linux-gnu inc=$tmp/root/usr/include/aarch64-linux-gnu
  for so in libopenblas.so libopenblas.so.0 libblas.so libblas.so.3 liblapack.so liblapack.so.3; do
    ln -sfn "openblas-pthread/$so" "$lib/$so"
  done
  ln -sfn openblas-pthread/cblas.h "$inc/cblas.h"
  ln -sfn openblas-pthread/openblas_config.h "$inc/openblas_config.h"
  printf '%s\n' "$want" >"$tmp/root/.lathe-packages"
  rm -rf "${sysroot%/}.old"
  [ -e "$sysroot" ] && mv "$sysroot" "${sysroot%/}.old"
  mv "$tmp/root" "$sysroot"
  rm -rf "$tmp" "${sysroot%/}.old"
}
if ((aarch64)); then
  sysroot=${LATHE_AARCH64_SYSROOT:-$HOME/.cache/lathe/aarch64-sysroot}
  mkdir -p "$(dirname "$sysroot")"
  aarch64_sysroot "$sysroot"
fi

# One interpreter looks for every module (importing torch alone takes seconds).
mapfile -t py_missing < <(python3 - "${PY_PACKAGES[@]}" <<'PY'
import importlib.util, sys
for name in sys.argv[1:]:
    if importlib.util.find_spec(name) is None:
        print(name)
PY
)
if ((${#py_missing[@]})); then
  echo "install-deps: pip install ${py_missing[*]}"
  python3 -m pip install -q "${py_missing[@]}" 2>/dev/null ||
    python3 -m pip install -q --break-system-packages "${py_missing[@]}"
fi

# cuDNN frontend headers (header-only C++ API over libcudnn, used by the CUDA attention op):
# NVIDIA ships them in the PyPI wheel nvidia-cudnn-frontend, whose include/ folder is all we need.
# Unpacked into .deps/cudnn-frontend/include (ignored by git), where CMake looks first. Without them the build still works, minus attention on CUDA.
CUDNN_FRONTEND_VERSION=1.32.0
root=$(cd "$(dirname "$0")/.." && pwd)
fe_dir=$root/.deps/cudnn-frontend
fe_stamp=$fe_dir/include/cudnn_frontend_version.h
IFS=. read -r fe_major fe_minor fe_patch <<<"$CUDNN_FRONTEND_VERSION"
if ! { grep -qs "CUDNN_FRONTEND_MAJOR_VERSION $fe_major\$" "$fe_stamp" &&
  grep -qs "CUDNN_FRONTEND_MINOR_VERSION $fe_minor\$" "$fe_stamp" &&
  grep -qs "CUDNN_FRONTEND_PATCH_VERSION $fe_patch\$" "$fe_stamp"; }; then
  echo "install-deps: cudnn-frontend $CUDNN_FRONTEND_VERSION headers -> $fe_dir/include"
  tmp=$(mktemp -d)
  if python3 -m pip download -q --no-deps "nvidia-cudnn-frontend==$CUDNN_FRONTEND_VERSION" -d "$tmp"; then
    rm -rf "$fe_dir" && mkdir -p "$fe_dir"
    python3 - "$tmp" "$fe_dir" <<'PY'
import pathlib, sys, zipfile
src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(src.glob("nvidia_cudnn_frontend-*.whl"))
with zipfile.ZipFile(wheel) as z:
    members = [n for n in z.namelist() if n.startswith("include/") and not n.endswith("/")]
    z.extractall(dst, members)
print(f"install-deps: {len(members)} header files from {wheel.name}")
PY
  else
    echo "install-deps: WARNING: could not fetch nvidia-cudnn-frontend; CUDA attention will not be built" >&2
  fi
  rm -rf "$tmp"
fi

#!/usr/bin/env bash
# Makes the relocatable release tarball lathe-<version>-linux-<arch>.tar.gz of a built lathe:
#
#   lathe-<version>-linux-<arch>/bin/lathe      the binary (debug info stripped), RUNPATH $ORIGIN/../lib
#   lathe-<version>-linux-<arch>/lib/*.so*      every shared library it needs, recursively, except
#                                               glibc's own and the CUDA/NVIDIA ones; RUNPATH $ORIGIN
#   lathe-<version>-linux-<arch>/README         what it holds, what the machine must provide
#
#   scripts/package.sh [BUILD_DIR] [OUT_DIR]    (defaults: build, dist)
#
# The architecture is read from the binary (x86-64 or aarch64, a cross build included), and the
# libraries from that architecture's multiarch folders (/usr/lib/<triple>, /lib/<triple>) and the
# binary's own RUNPATH, so the same script packs build/ and build-aarch64/; LATHE_PACKAGE_LIBDIRS
# (colon-separated folders, searched first) points at libraries kept outside those folders (the
# aarch64 cross build's sysroot, scripts/test-aarch64.sh). Needs readelf,
# patchelf and the architecture's strip (binutils-aarch64-linux-gnu for aarch64). Prints the
# tarball's path. Written under a temporary name, renamed when complete.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
out=${2:-$root/dist}
bin=$build/lathe
if [ ! -x "$bin" ]; then
  echo "package: error: no lathe binary at $bin (build it first: scripts/build.sh)" >&2
  exit 2
fi
for tool in readelf patchelf python3; do
  command -v "$tool" >/dev/null || {
    echo "package: error: $tool not found (scripts/install-deps.sh installs it)" >&2
    exit 2
  }
done
version=$(sed -n 's/^project(lathe .*VERSION \([0-9][0-9.]*\)).*/\1/p' "$root/CMakeLists.txt")
[ -n "$version" ] || {
  echo "package: error: no VERSION in $root/CMakeLists.txt's project()" >&2
  exit 2
}
machine=$(readelf -h "$bin" | sed -n 's/^ *Machine: *//p')
case $machine in
  *X86-64*) arch=x86_64 triple=x86_64-linux-gnu strip=strip ;;
  *AArch64*) arch=aarch64 triple=aarch64-linux-gnu strip=aarch64-linux-gnu-strip ;;
  *)
    echo "package: error: $bin is for '$machine'; lathe packs x86-64 and aarch64" >&2
    exit 2
    ;;
esac
command -v "$strip" >/dev/null || {
  echo "package: error: $strip not found (binutils for $arch)" >&2
  exit 2
}
name=lathe-$version-linux-$arch
mkdir -p "$out"
stage=$(mktemp -d "$out/.$name.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/$name/bin" "$stage/$name/lib"
cp "$bin" "$stage/$name/bin/lathe"
"$strip" --strip-debug "$stage/$name/bin/lathe"

# The DT_NEEDED closure, resolved as the dynamic loader would on a Debian machine of that
# architecture: the binary's RUNPATH first, then LATHE_PACKAGE_LIBDIRS, then the multiarch folders.
python3 - "$bin" "$triple" "$stage/$name/lib" >"$stage/libs.txt" <<'PY'
import os, re, shutil, subprocess, sys
binary, triple, dest = sys.argv[1:]
# Provided by every Linux machine of the architecture (glibc) or by its CUDA installation and
# driver: never bundled.
SYSTEM = re.compile(r"^(ld-linux.*|libc|libm|libdl|libpthread|librt|libresolv|libutil|libmvec|"
                    r"libcuda|libcudart|libcublas|libcublasLt|libcudnn.*|libnccl|libnvrtc.*|"
                    r"libnvidia-.*|libnvJitLink|libcufft|libcurand|libcusparse|libcusolver)\.so")

def dynamic(path):
    text = subprocess.run(["readelf", "-d", path], capture_output=True, text=True,
                          check=True).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.+)\]", text)
    runpath = re.findall(r"\((?:RUNPATH|RPATH)\).*\[(.+)\]", text)
    dirs = [d for r in runpath for d in r.split(":") if d and "$ORIGIN" not in d]
    return needed, dirs

extra = [d for d in os.environ.get("LATHE_PACKAGE_LIBDIRS", "").split(":") if d]
search = extra + [f"/usr/lib/{triple}", f"/lib/{triple}", "/usr/lib", "/lib"]
seen, queue = {}, [binary]
while queue:
    needed, dirs = dynamic(queue.pop())
    for lib in needed:
        if lib in seen or SYSTEM.match(lib):
            continue
        for d in dirs + search:
            cand = os.path.join(d, lib)
            if os.path.exists(cand):
                seen[lib] = os.path.realpath(cand)
                queue.append(seen[lib])
                break
        else:
            sys.exit(f"package: error: {lib} (needed by {binary}'s closure) not found in "
                     f"{dirs + search}; install the {triple} package that ships it")
for lib, path in sorted(seen.items()):
    shutil.copyfile(path, os.path.join(dest, lib))
    os.chmod(os.path.join(dest, lib), 0o755)
    print(lib)
PY
patchelf --set-rpath '$ORIGIN/../lib' "$stage/$name/bin/lathe"
for lib in "$stage/$name/lib"/*; do
  patchelf --set-rpath '$ORIGIN' "$lib"
done

libs=$(sed 's/^/  /' "$stage/libs.txt")
glibc=$(ldd --version 2>/dev/null | sed -n '1s/.* //p')
cuda_needed=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(lib\(cuda\|cublas\|cudnn\|nccl\|nvrtc\)[^]]*\)\]/    \1/p')
if [ -n "$cuda_needed" ]; then
  provides="  the NVIDIA driver, and these libraries of the CUDA toolkit, cuDNN 9 and NCCL (a GPU
  cluster's CUDA module, or /usr/local/cuda), found through LD_LIBRARY_PATH or ld.so.conf:
$cuda_needed"
else
  provides="  nothing else: this build has no CUDA backend (CPU only; lathe doctor says so)"
fi
cat >"$stage/$name/README" <<EOF
lathe $version for Linux $arch

  bin/lathe    the lathe binary (lathe --help, lathe doctor)
  lib/         the shared libraries it needs beyond glibc and CUDA, found through the binary's
               RUNPATH (\$ORIGIN/../lib): no LD_LIBRARY_PATH needed, the folder can live anywhere

Bundled libraries:
$libs

The machine provides:
  glibc $glibc or newer (the build machine's), as every Linux of this architecture does
$provides

The bundled OpenMPI libraries (when listed) let lathe start and run single-process or
lathe launch/torchrun-style jobs; under the cluster's mpirun, put that OpenMPI's lib folder
(ABI libmpi.so.40, OpenMPI 4.x) first in LD_LIBRARY_PATH. Never LD_PRELOAD a second libnccl.

Check that every library resolves inside lib/ or to the system:
  ldd bin/lathe
EOF

tarball=$out/$name.tar.gz
tar -C "$stage" -czf "$stage/$name.tar.gz" "$name"
mv -f "$stage/$name.tar.gz" "$tarball"
echo "$tarball"

#!/usr/bin/env bash
# Checks a tarball of scripts/package.sh where none of lathe's -dev packages can help it:
#
#   scripts/package-check.sh TARBALL WORK_DIR
#
# 1. Library resolution (the ldd check): the dynamic loader of the tarball's architecture lists
#    where each library of bin/lathe resolves (ldd on x86-64; aarch64's ld.so --list under
#    qemu-user); every one must be inside the tarball's lib/, glibc's, or the CUDA/NVIDIA ones
#    that README names as the machine's.
# 2. x86-64: a clean root (chroot) holding only glibc's libraries, the CUDA libraries the binary
#    names (hard links to this machine's, the way a GPU cluster's CUDA module provides them) and
#    the unpacked tarball: no /usr/lib of -dev packages, no ld.so.cache, no LD_LIBRARY_PATH. In
#    it: lathe --version, then a smoke of tokenizer train, prepare and 4 CPU training steps on a
#    small corpus, checkpoint written. Needs root (chroot).
#    aarch64: lathe --version under qemu-user.
set -euo pipefail
if (($# != 2)); then
  echo "usage: $0 TARBALL WORK_DIR" >&2
  exit 2
fi
tarball=$(realpath "$1") work=$2
name=$(basename "$tarball" .tar.gz)
case $name in
  *-linux-x86_64) arch=x86_64 triple=x86_64-linux-gnu ;;
  *-linux-aarch64) arch=aarch64 triple=aarch64-linux-gnu ;;
  *)
    echo "package-check: error: $tarball is not a lathe-<version>-linux-<arch>.tar.gz" >&2
    exit 2
    ;;
esac
rm -rf "$work" && mkdir -p "$work/root/opt"
tar -C "$work/root/opt" -xzf "$tarball"
pkg=$work/root/opt/$name
for f in bin/lathe README; do
  [ -e "$pkg/$f" ] || {
    echo "package-check: FAIL: $name has no $f" >&2
    exit 1
  }
done
[ "$(readelf -d "$pkg/bin/lathe" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')" = '$ORIGIN/../lib' ] || {
  echo "package-check: FAIL: bin/lathe's RUNPATH is not \$ORIGIN/../lib" >&2
  exit 1
}

# 1. Where each library resolves.
if [ "$arch" = x86_64 ]; then
  listing=$(env -u LD_LIBRARY_PATH ldd "$pkg/bin/lathe")
else
  listing=$(env -u LD_LIBRARY_PATH qemu-aarch64-static -L /usr/aarch64-linux-gnu \
    /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 --list "$pkg/bin/lathe")
fi
system='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libmvec|libcuda|libcudart|libcublas|libcublasLt|libcudnn|libnccl|libnvrtc)[.-]'
bad=0
while read -r lib arrow path _; do
  [ "$arrow" = "=>" ] || continue
  if [ "$path" = "not" ]; then
    echo "package-check: FAIL: $lib not found" >&2
    bad=1
  elif [[ $path != "$pkg/bin/../lib/"* && $path != "$pkg/lib/"* ]] && ! [[ ${lib##*/} =~ $system ]]; then
    echo "package-check: FAIL: $lib resolves outside the tarball: $path" >&2
    bad=1
  fi
done <<<"$listing"
((bad == 0)) || exit 1
echo "package-check: every library of $name resolves inside lib/ or to glibc/CUDA"

if [ "$arch" = aarch64 ]; then
  # OPENBLAS_NUM_THREADS=1: OpenBLAS's thread pool hangs at start-up under qemu-user.
  v=$(OPENBLAS_NUM_THREADS=1 qemu-aarch64-static -L /usr/aarch64-linux-gnu "$pkg/bin/lathe" --version)
  echo "package-check: $name (qemu-user): $v"
  exit 0
fi

# 2. The clean root: glibc, the CUDA libraries named, the tarball; nothing else.
if [ "$(id -u)" -ne 0 ]; then
  echo "package-check: error: the clean-root run needs root (chroot)" >&2
  exit 2
fi
root=$work/root
mkdir -p "$root/lib64" "$root/lib/$triple" "$root/usr/lib/$triple" "$root/tmp" "$root/work"
cp -L /lib64/ld-linux-x86-64.so.2 "$root/lib64/"
for l in libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1; do
  cp -L "/lib/$triple/$l" "$root/lib/$triple/"
done
while read -r lib arrow path _; do
  [ "$arrow" = "=>" ] || continue
  case $lib in
    libcuda* | libcublas* | libcudnn* | libnccl* | libnvrtc*)
      real=$(realpath "$path")
      ln "$real" "$root/usr/lib/$triple/$lib" 2>/dev/null || cp "$real" "$root/usr/lib/$triple/$lib"
      ;;
  esac
done <<<"$listing"
python3 - "$root/work/corpus.jsonl" <<'PY'
import json, sys
words = ("lathe prepares data trains and adapts language models on one build of one binary "
         "tokens flow from text through the tokenizer into files the trainer reads").split()
with open(sys.argv[1], "w") as f:
    for i in range(400):
        f.write(json.dumps({"text": " ".join(words[(i * 7 + k) % len(words)] for k in range(40))}) + "\n")
PY
cat >"$root/work/tiny.yaml" <<'EOF'
model:
  family: llama
  hidden_size: 32
  intermediate_size: 64
  num_hidden_layers: 1
  num_attention_heads: 2
  num_key_value_heads: 1
  max_position_embeddings: 64
  tie_word_embeddings: true
data:
  path: /work/tokens
  tokenizer: /work/tok.json
  split: "100,0,0"
  seq_length: 16
train:
  steps: 4
  micro_batch_size: 2
  log_interval: 1
  device: cpu
  threads: 2
checkpoint:
  interval: 4
EOF
# A mount namespace of its own holds the root's /proc (the dynamic loader reads /proc/self/exe to
# expand $ORIGIN); it disappears with the command.
mkdir -p "$root/proc"
in_root() {
  unshare --mount -- bash -c 'mount --bind /proc "$0/proc" &&
    exec env -i PATH="/opt/$1/bin" HOME=/work TMPDIR=/tmp "$(command -v chroot)" "$0" "${@:2}"' \
    "$root" "$name" "$@"
}
v=$(in_root "/opt/$name/bin/lathe" --version)
echo "package-check: $name in a clean root: $v"
in_root lathe tokenizer train --vocab-size 300 --special-tokens '<|endoftext|>' \
  --input /work/corpus.jsonl --output /work/tok.json >/dev/null 2>&1
in_root lathe prepare --tokenizer /work/tok.json --input /work/corpus.jsonl \
  --output-prefix /work/tokens --append-eod >/dev/null 2>&1
in_root lathe --quiet train /work/tiny.yaml --run-dir /work/run >/dev/null
find "$root/work/run" -name '*.safetensors' | grep -q . || {
  echo "package-check: FAIL: the smoke run wrote no checkpoint" >&2
  exit 1
}
echo "package-check: tokenizer train, prepare and 4 CPU training steps ran in the clean root"

#!/usr/bin/env bash
# Installs what lathe needs to build and test on a fresh Debian/Ubuntu machine: the -dev packages
# it links, the Debian dictionaries it uses as embedded default corpora, and the Python packages
# its reference tests compare against. Idempotent and quick when everything is there already.
set -euo pipefail

DEB_PACKAGES=(
  build-essential cmake ninja-build pkg-config ccache git python3 python3-pip
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libfmt-dev libpcre2-dev libutf8proc-dev
  libzstd-dev zlib1g-dev libsimdjson-dev libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev zstd
  dict-gcide dict-foldoc dict-freedict-deu-eng dict-freedict-fra-eng dict-freedict-jpn-eng
  dict-freedict-eng-rus dict-freedict-ara-eng dict-freedict-eng-hin dict-freedict-ell-eng
)
PY_PACKAGES=(tokenizers numpy jinja2 pytest safetensors zstandard transformers)

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

py_missing=()
for p in "${PY_PACKAGES[@]}"; do
  python3 -c "import ${p}" 2>/dev/null || py_missing+=("$p")
done
if ((${#py_missing[@]})); then
  echo "install-deps: pip install ${py_missing[*]}"
  python3 -m pip install -q "${py_missing[@]}" 2>/dev/null ||
    python3 -m pip install -q --break-system-packages "${py_missing[@]}"
fi

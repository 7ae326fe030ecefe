#!/usr/bin/env bash
# Checks that every C++/CUDA source git tracks is formatted as .clang-format says (Debian 12's
# clang-format 14, which scripts/install-deps.sh installs). Lists the files that differ and exits 1;
# `scripts/format-check.sh --fix` formats them in place.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "format-check: clang-format is not installed (scripts/install-deps.sh)" >&2; exit 1; }
mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
if [[ ${1:-} == --fix ]]; then
    clang-format -i "${files[@]}"
    exit 0
fi
bad=()
for f in "${files[@]}"; do
    clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
    printf 'format-check: %d of %d files differ from .clang-format (fix: scripts/format-check.sh --fix):\n' "${#bad[@]}" "${#files[@]}"
    printf '  %s\n' "${bad[@]}"
    exit 1
fi
echo "format-check: ${#files[@]} files formatted as .clang-format says"

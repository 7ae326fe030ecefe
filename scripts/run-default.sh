#!/usr/bin/env bash
# The main job on the embedded default corpus: Debian's dict-gcide (about 40 MB of English).
# Installs what it needs, builds, trains a byte-level BPE tokenizer on GCIDE, prepares the whole
# dictionary into GPT-NeoX token files on every core, and validates them.
# Outputs go to ${LATHE_RUN_DIR:-runs/default}.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh >/dev/null
LATHE=./build/lathe
RUN=${LATHE_RUN_DIR:-runs/default}
CORPUS=/usr/share/dictd/gcide.dict.dz
mkdir -p "$RUN"

if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "== GPU: $(nvidia-smi -L | head -n 1)"
else
  echo "== no GPU found: running on the CPU ($(nproc) cores)"
fi

echo "== 1/3 tokenizer: byte-level BPE, 16k vocabulary, trained on GCIDE"
$LATHE tokenizer train --vocab-size 16384 --special-tokens "<|endoftext|>,<|padding|>" \
  --format text-blocks --input "$CORPUS" --output "$RUN/tokenizer.json"

echo "== 2/3 prepare: GCIDE -> $RUN/gcide.bin/.idx (one document per dictionary block)"
$LATHE prepare --tokenizer "$RUN/tokenizer.json" --input "$CORPUS" --format text-blocks \
  --append-eod --output-prefix "$RUN/gcide"

echo "== 3/3 validate and inspect"
$LATHE data info "$RUN/gcide"
$LATHE data dump "$RUN/gcide" --doc 1000 --tokenizer "$RUN/tokenizer.json"
echo "== done: tokenizer $RUN/tokenizer.json, token files $RUN/gcide.bin/.idx"

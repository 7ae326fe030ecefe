#!/usr/bin/env bash
# The main job on the embedded default corpus, Debian's dict-gcide (about 40 MB of English):
#   1. train a byte-level BPE tokenizer on GCIDE,
#   2. prepare GCIDE into GPT-NeoX token files with it (all cores), keeping the last ~2 MB apart
#      as held-out text,
#   3. train configs/tiny.yaml (a small Llama) on it until the loss has clearly fallen,
#   4. evaluate the final checkpoint on the held-out text and print where it is,
#   5. write the run's HTML report (`lathe report`: loss, lr, grad norm, tokens/s plots) and
#      print its path.
# Installs what it needs and builds first. Outputs go to ${LATHE_RUN_DIR:-runs/default}.
# Training runs on the GPU when one answers (train.device: auto), else on the CPU reference backend.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh >/dev/null
LATHE=./build/lathe
RUN=${LATHE_RUN_DIR:-runs/default}
CORPUS=/usr/share/dictd/gcide.dict.dz
mkdir -p "$RUN"

if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "== GPU: $(nvidia-smi -L | head -n 1) (train.device auto picks it when lathe can run the model there)"
else
  echo "== no GPU: running on the CPU ($(nproc) cores)"
fi

echo "== 1/4 corpus: GCIDE, the last 2 MB held out (a few entries are not valid UTF-8: skipped and counted)"
zcat "$CORPUS" >"$RUN/gcide-all.txt"
keep=$(($(stat -c %s "$RUN/gcide-all.txt") - 2000000))
head -c "$keep" "$RUN/gcide-all.txt" >"$RUN/gcide-train.txt"
tail -c +"$((keep + 1))" "$RUN/gcide-all.txt" >"$RUN/gcide-heldout.txt"
rm "$RUN/gcide-all.txt"

echo "== 2/4 tokenizer (byte-level BPE, 8192 entries) and token files"
$LATHE tokenizer train --vocab-size 8192 --special-tokens "<|endoftext|>,<|padding|>" \
  --format text-blocks --on-error skip --input "$RUN/gcide-train.txt" --output "$RUN/tokenizer.json"
$LATHE prepare --tokenizer "$RUN/tokenizer.json" --input "$RUN/gcide-train.txt" \
  --format text-blocks --on-error skip --append-eod --output-prefix "$RUN/gcide"
$LATHE prepare --tokenizer "$RUN/tokenizer.json" --input "$RUN/gcide-heldout.txt" \
  --format text-blocks --on-error skip --append-eod --output-prefix "$RUN/heldout"
$LATHE data info "$RUN/gcide"

echo "== 3/4 train configs/tiny.yaml (a rerun of this script resumes or skips finished work)"
$LATHE train configs/tiny.yaml --run-dir "$RUN/tiny" \
  --set data.path="$RUN/gcide" --set data.tokenizer="$RUN/tokenizer.json"

echo "== 4/4 held-out loss (a uniform guess over 8192 tokens scores ln 8192 = 9.01)"
CKPT="$RUN/tiny/checkpoints/$(cat "$RUN/tiny/checkpoints/latest")"
$LATHE eval loss --checkpoint "$CKPT" --data "$RUN/heldout" --seq-len 128 --batches 64
echo "== done: checkpoint $CKPT (a Hugging Face folder: config.json, model.safetensors, tokenizer.json)"
echo "== report of the run (one HTML file, open it in a browser):"
$LATHE report "$RUN/tiny" --output "$RUN/tiny/report.html"

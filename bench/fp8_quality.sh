#!/usr/bin/env bash
# The FP8 quality comparison of docs/FP8.md: configs/fp8-quality-300m.yaml trained in bf16 and in
# each FP8 recipe (tensorwise, delayed, blockwise) on the same data with the same seed, each run on
# its own GPU when the machine has several (else one after another), then the curves.
#
#   bash bench/fp8_quality.sh LATHE CORPUS.txt TOKENIZER.json OUT
#
# CORPUS.txt: bench/fp8_quality_corpus.py's text; TOKENIZER.json: GPT-2's. OUT gets each run's
# log and metrics.jsonl (q-<recipe>.*) and fp8_quality.svg (bench/fp8_quality_plot.py).
# FP8_QUALITY_LIMIT: seconds each run may take (default 600).
set -uo pipefail
lathe=${1:?usage: fp8_quality.sh LATHE CORPUS.txt TOKENIZER.json OUT}
corpus=${2:?corpus}
tok=${3:?tokenizer}
out=${4:?out}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
mkdir -p "$out"
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT  # the token files and each run's folder (its final checkpoint: GBs)
"$lathe" prepare --tokenizer "$tok" --input "$corpus" --format text-blocks --on-error skip \
  --append-eod --output-prefix "$data/corpus" --no-progress >"$out/prepare.log" 2>&1 ||
  { echo "fp8_quality: prepare failed (see $out/prepare.log)"; exit 1; }
# The GPUs this script may use: CUDA_VISIBLE_DEVICES's list when set, else every GPU.
if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
  IFS=, read -ra devices <<<"$CUDA_VISIBLE_DEVICES"
else
  mapfile -t devices < <(nvidia-smi -L 2>/dev/null | grep '^GPU' | sed 's/^GPU \([0-9]*\):.*/\1/')
fi
((${#devices[@]} > 0)) || devices=(0)
gpus=${#devices[@]}
recipes=(bf16 tensorwise delayed blockwise)
run() {  # recipe gpu
  local sets=(--set "data.path=$data/corpus" --set "data.tokenizer=$tok" --set train.device=cuda)
  [[ $1 != bf16 ]] && sets+=(--set train.precision=fp8 --set "fp8.recipe=$1")
  CUDA_VISIBLE_DEVICES=$2 timeout "${FP8_QUALITY_LIMIT:-600}" "$lathe" train \
    "$root/configs/fp8-quality-300m.yaml" --run-dir "$data/q-$1" "${sets[@]}" >"$out/q-$1.log" 2>&1
  local rc=$?
  cp "$data/q-$1/metrics.jsonl" "$out/q-$1.metrics.jsonl" 2>/dev/null
  echo "fp8_quality: $1 rc=$rc $(grep 'validation loss' "$out/q-$1.log" | tail -1)"
}
i=0
for r in "${recipes[@]}"; do
  run "$r" "${devices[$((i % gpus))]}" &
  i=$((i + 1))
  ((i % gpus == 0)) && wait
done
wait
python3 "$here/fp8_quality_plot.py" "$out/fp8_quality.svg" "$out"/q-*.metrics.jsonl

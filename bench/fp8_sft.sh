#!/usr/bin/env bash
# The FP8 fine-tuning comparison of docs/FP8.md: configs/fp8-quality-300m.yaml pretrained in bf16
# for PRE steps on the quality corpus (bench/fp8_quality_corpus.py), then fine-tuned from that
# checkpoint on SFT records (bench/fp8_sft_corpus.py: PubMedQA answers and GCIDE definitions, loss
# on the answers only, GPT-2's tokenizer with bench/fp8_sft_chat_template.json) in bf16 and in each
# FP8 recipe, same seed and data, each run on its own GPU when the machine has several.
#
#   bash bench/fp8_sft.sh LATHE PRETRAIN_CORPUS.txt SFT.jsonl TOKENIZER.json OUT
#
# OUT gets the logs and metrics.jsonl of the pretraining (pre.*) and of each fine-tune
# (sft-<recipe>.*) and fp8_sft.svg. FP8_SFT_PRE (default 1000) and FP8_SFT_STEPS (default 400):
# steps of the two stages; FP8_SFT_LIMIT: seconds each run may take (default 600).
set -uo pipefail
lathe=${1:?usage: fp8_sft.sh LATHE PRETRAIN_CORPUS.txt SFT.jsonl TOKENIZER.json OUT}
corpus=${2:?pretraining corpus}
sft=${3:?sft records}
tok=${4:?tokenizer}
out=${5:?out}
pre=${FP8_SFT_PRE:-1000}
steps=${FP8_SFT_STEPS:-400}
limit=${FP8_SFT_LIMIT:-600}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
config=$root/configs/fp8-quality-300m.yaml
mkdir -p "$out"
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT  # token files and checkpoints (GBs)
"$lathe" prepare --tokenizer "$tok" --input "$corpus" --format text-blocks --on-error skip \
  --append-eod --output-prefix "$data/corpus" --no-progress >"$out/prepare.log" 2>&1 ||
  { echo "fp8_sft: prepare of the corpus failed (see $out/prepare.log)"; exit 1; }
# The last 5 % of the records are the validation set (label files need explicit validation data).
n=$(wc -l <"$sft")
head -n $((n - n / 20)) "$sft" >"$data/sft-train.jsonl"
tail -n $((n / 20)) "$sft" >"$data/sft-valid.jsonl"
for part in train valid; do
  "$lathe" prepare --tokenizer "$tok" --chat-template-config "$here/fp8_sft_chat_template.json" \
    --input "$data/sft-$part.jsonl" --format alpaca --seq-length 1024 --on-error skip \
    --output-prefix "$data/sft-$part" --no-progress >>"$out/prepare.log" 2>&1 ||
    { echo "fp8_sft: prepare of the SFT records failed (see $out/prepare.log)"; exit 1; }
done
if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
  IFS=, read -ra devices <<<"$CUDA_VISIBLE_DEVICES"
else
  mapfile -t devices < <(nvidia-smi -L 2>/dev/null | grep '^GPU' | sed 's/^GPU \([0-9]*\):.*/\1/')
fi
((${#devices[@]} > 0)) || devices=(0)
gpus=${#devices[@]}
CUDA_VISIBLE_DEVICES=${devices[0]} timeout "$limit" "$lathe" train "$config" --run-dir "$data/pre" \
  --set "data.path=$data/corpus" --set "data.tokenizer=$tok" --set train.device=cuda \
  --set "train.steps=$pre" --set checkpoint.interval=0 >"$out/pre.log" 2>&1
rc=$?
cp "$data/pre/metrics.jsonl" "$out/pre.metrics.jsonl" 2>/dev/null
echo "fp8_sft: pretraining rc=$rc $(grep 'validation loss' "$out/pre.log" | tail -1)"
((rc == 0)) || exit 1
run() {  # recipe gpu
  local sets=(--set "data.path=$data/sft-train" --set "data.label_path=$data/sft-train_label"
    --set "data.valid_path=$data/sft-valid" --set "data.valid_label_path=$data/sft-valid_label"
    --set "data.tokenizer=$tok" --set data.split=100,0,0 --set train.device=cuda
    --set "train.steps=$steps" --set train.eval_interval=50 --set checkpoint.interval=0
    --set "checkpoint.init_from=$data/pre" --set optimizer.lr=1e-4 --set optimizer.min_lr=1e-5)
  [[ $1 != bf16 ]] && sets+=(--set train.precision=fp8 --set "fp8.recipe=$1")
  CUDA_VISIBLE_DEVICES=$2 timeout "$limit" "$lathe" train "$config" --run-dir "$data/sft-$1" \
    "${sets[@]}" >"$out/sft-$1.log" 2>&1
  local rc=$?
  cp "$data/sft-$1/metrics.jsonl" "$out/sft-$1.metrics.jsonl" 2>/dev/null
  echo "fp8_sft: $1 rc=$rc $(grep 'validation loss' "$out/sft-$1.log" | tail -1)"
}
i=0
for r in bf16 tensorwise delayed blockwise; do
  run "$r" "${devices[$((i % gpus))]}" &
  i=$((i + 1))
  ((i % gpus == 0)) && wait
done
wait
python3 "$here/fp8_quality_plot.py" "$out/fp8_sft.svg" "$out"/sft-*.metrics.jsonl

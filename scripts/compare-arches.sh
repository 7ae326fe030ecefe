#!/usr/bin/env bash
# Runs the same lathe commands on the same inputs with two lathe binaries (the x86-64 build and
# the aarch64 cross build under qemu-user, scripts/test-aarch64.sh) and compares every output file
# byte for byte. Fails naming each file that differs, except the CPU training's checkpoints and
# metrics, which go through OpenBLAS and are reported with their largest differences.
#
#   scripts/compare-arches.sh LATHE_A LATHE_B WORK_DIR
#
# LATHE_A and LATHE_B are commands (a binary, or a wrapper script such as
# build-aarch64/qemu/lathe). What is compared:
#   tokens     lathe prepare on a varied Unicode corpus (tests/corpus.py) with every tokenizer of
#              ../shared/tokenizers: P.bin and P.idx
#   tokenizer  lathe tokenizer train (byte-level BPE): tokenizer.json
#   train      lathe train on the CPU of a two-layer Llama for 6 steps, checkpoint every 3, then
#              resumed to 8 steps: the checkpoints' safetensors, optimizer and trainer state,
#              metrics.jsonl without its timing fields
#   convert    lathe convert of A's checkpoint to a Hugging Face folder (fp32 and bf16), by both
#   align      lathe align terms (mined terms, the extended tokenizer) and lathe align embed (GloVe
#              and skip-gram on the CPU, one thread) on the prepared tokens
set -euo pipefail
if (($# != 3)); then
  echo "usage: $0 LATHE_A LATHE_B WORK_DIR" >&2
  exit 2
fi
lathe_a=$1 lathe_b=$2 work=$3
root=$(cd "$(dirname "$0")/.." && pwd)
shared=${LATHE_SHARED_DIR:-$root/../shared}
rm -rf "$work" && mkdir -p "$work/in" "$work/a" "$work/b"
in=$work/in

# Inputs, written once and read by both binaries.
python3 - "$in" "$root/tests" <<'PY'
import json, sys
from pathlib import Path
out, tests = Path(sys.argv[1]), sys.argv[2]
sys.path.insert(0, tests)
from corpus import build_corpus
docs = build_corpus(total_bytes=400_000, seed=7, special_strings=["<|endoftext|>"])
with open(out / "corpus.jsonl", "w", encoding="utf-8") as f:
    for d in docs:
        f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
# Plain English lines for the domain/general corpora of align terms.
with open(out / "domain.txt", "w", encoding="utf-8") as f:
    for d in docs:
        if d.isascii() and len(d) > 40:
            f.write(" ".join(d.split()) + "\n")
PY

cat >"$in/tiny.yaml" <<EOF
model:
  family: llama
  hidden_size: 48
  intermediate_size: 96
  num_hidden_layers: 2
  num_attention_heads: 4
  num_key_value_heads: 2
  max_position_embeddings: 64
  tie_word_embeddings: true
data:
  path: $in/train
  tokenizer: $in/tok.json
  split: "90,10,0"
  seq_length: 32
train:
  steps: 6
  micro_batch_size: 4
  gradient_accumulation_steps: 2
  log_interval: 1
  eval_interval: 3
  eval_iters: 2
  threads: 2
  device: cpu
optimizer:
  lr: 3.0e-3
lr:
  warmup: 0.1
checkpoint:
  interval: 3
  keep_last: 3
EOF

# The training data: A's tokenizer and tokens (the tokenizer and prepare outputs are compared
# separately), so that both trainings start from the same input.
$lathe_a tokenizer train --vocab-size 384 --special-tokens '<|endoftext|>' \
  --input "$in/corpus.jsonl" --output "$in/tok.json" >/dev/null
$lathe_a prepare --tokenizer "$in/tok.json" --input "$in/corpus.jsonl" \
  --output-prefix "$in/train" --append-eod --on-error skip >/dev/null 2>&1

for side in a b; do
  lathe=$lathe_a
  [ "$side" = b ] && lathe=$lathe_b
  out=$work/$side
  s=$(date +%s)
  mkdir -p "$out/tokens"
  for t in "$shared"/tokenizers/*.json; do
    case $t in *tokenizer_config.json) continue ;; esac
    name=$(basename "$t" .json)
    $lathe prepare --tokenizer "$t" --input "$in/corpus.jsonl" --output-prefix "$out/tokens/$name" \
      --append-eod --on-error skip --threads 2 >/dev/null 2>&1
  done
  $lathe tokenizer train --vocab-size 384 --special-tokens '<|endoftext|>' \
    --input "$in/corpus.jsonl" --output "$out/tokenizer.json" >/dev/null
  $lathe --quiet train "$in/tiny.yaml" --run-dir "$out/run" >/dev/null
  $lathe --quiet train "$in/tiny.yaml" --run-dir "$out/run" --set train.steps=8 >/dev/null
  # Timing fields are measurements, not results.
  python3 - "$out/run/metrics.jsonl" "$out/metrics.results.jsonl" <<'PY'
import json, sys
with open(sys.argv[1]) as f, open(sys.argv[2], "w") as g:
    for line in f:
        j = json.loads(line)
        for k in ("tokens_per_s", "mfu", "memory_bytes", "time", "elapsed_s", "step_time_s"):
            j.pop(k, None)
        g.write(json.dumps(j, sort_keys=True) + "\n")
PY
  rm "$out/run/metrics.jsonl"
  $lathe convert "$work/a/run" "$out/hf32" --to hf --dtype fp32 >/dev/null 2>&1 ||
    $lathe convert "$work/a/run" "$out/hf32" --to hf --dtype fp32
  $lathe convert "$work/a/run" "$out/hf16" --to hf --dtype bf16 >/dev/null 2>&1
  mkdir -p "$out/align"
  $lathe align terms --tokenizer "$shared/tokenizers/gpt2.json" --corpus "$in/domain.txt" \
    --output "$out/align/tokenizer.json" --top-k 50 --min-count 3 --max-ngram 2 >/dev/null 2>&1
  $lathe align embed --tokens "$out/tokens/gpt2" --output "$out/align/gpt2.vectors.txt" \
    --method glove --dim 16 --iters 3 --min-count 1 --device cpu --threads 1 >/dev/null 2>&1
  $lathe align embed --tokens "$out/tokens/gpt2" --output "$out/align/gpt2.sgns.txt" \
    --method sgns --dim 16 --iters 2 --min-count 1 --device cpu --threads 1 >/dev/null 2>&1
  echo "compare-arches: $side ($lathe) $(($(date +%s) - s)) s"
done

# Every file either side wrote, except what holds paths, times or hosts rather than results.
cd "$work/a"
mapfile -t files < <(find . -type f ! -name '*.log' ! -path './run/tb/*' ! -name '*.lock' \
  ! -name 'config.yaml' ! -name '*.stage.json' ! -name 'memory_plan.txt' | sort)
(cd "$work/b" && find . -type f ! -name '*.log' ! -path './run/tb/*' ! -name '*.lock' \
  ! -name 'config.yaml' ! -name '*.stage.json' ! -name 'memory_plan.txt' | sort) >"$work/b.list"
if ! diff <(printf '%s\n' "${files[@]}") "$work/b.list" >"$work/list.diff"; then
  echo "compare-arches: the two sides wrote different files:" >&2
  cat "$work/list.diff" >&2
  exit 1
fi
# Files that name their own output folder (align terms' new_tokens.json names its tokenizer) are
# compared with each side's folder written as WORK.
same_but_paths() {
  cmp -s <(sed "s|$work/a/|WORK/|g" "$1") <(sed "s|$work/b/|WORK/|g" "$work/b/$1")
}
# The CPU training (checkpoints and metrics) multiplies through OpenBLAS, whose sgemm kernels are
# chosen per CPU (Haswell/SkylakeX on x86-64, NEON on aarch64) and sum in different orders: its
# bytes are reported, with the largest difference of each tensor, and do not fail the comparison.
blas_dependent() {
  case $1 in ./run/* | ./metrics.results.jsonl) return 0 ;; esac
  return 1
}
differ=0 reported=0
for f in "${files[@]}"; do
  cmp -s "$f" "$work/b/$f" && continue
  same_but_paths "$f" && continue
  if blas_dependent "$f"; then
    echo "compare-arches: REPORTED (OpenBLAS) $f: $(cmp "$f" "$work/b/$f" 2>&1 | head -1)"
    case $f in
      *.safetensors)
        python3 - "$f" "$work/b/$f" <<'PY'
import sys
import numpy as np
from safetensors.numpy import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
for k in sorted(a):
    x, y = a[k].astype(np.float64), b[k].astype(np.float64)
    if x.shape != y.shape:
        print(f"compare-arches:   {k}: shapes {x.shape} and {y.shape}")
    elif (a[k] != b[k]).any():
        rel = np.abs(x - y).max() / max(np.abs(x).max(), 1e-30)
        print(f"compare-arches:   {k}: {(a[k] != b[k]).mean():.0%} of elements differ, "
              f"largest by {np.abs(x - y).max():.3g} ({rel:.2g} of the largest |value|)")
PY
        ;;
    esac
    reported=$((reported + 1))
    continue
  fi
  echo "compare-arches: DIFFER $f ($(cmp "$f" "$work/b/$f" 2>&1 | head -1))" >&2
  differ=$((differ + 1))
done
if ((differ)); then
  echo "compare-arches: $differ of ${#files[@]} files differ" >&2
  exit 1
fi
echo "compare-arches: $((${#files[@]} - reported)) of ${#files[@]} files identical byte for byte" \
  "(paths to each side's own folder aside); $reported training files differ (OpenBLAS, above)"

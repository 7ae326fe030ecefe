#!/usr/bin/env bash
# Training speed of configs/llama3-8b-speed.yaml (the Llama-3-8B shape at T 4096) under
# tensor-parallel, data-parallel and ZeRO layouts on one machine's GPUs, for docs/PERF.md.
#
#   bash bench/tp_train.sh LATHE CORPUS.txt TOKENIZER.json OUT ROW...
#
# ROW is NAME:GPUS[:KEY=VALUE,...], e.g. tp4:4:parallel.tensor=4 or
# zero3:4:parallel.zero_stage=3,train.recompute=selective. Each row runs `lathe launch --gpus GPUS
# -- lathe train` until metrics.jsonl holds TP_TRAIN_STEPS logged steps (default 6), then stops
# it (SIGKILL: no checkpoint of an 8B model is written) and appends one JSON line to
# OUT/tp_train.jsonl: tokens/s and MFU over the steps after the first two (the trainer's figures
# are averages since its start, so the steady rate comes from their differences), the peak
# memory the trainer logged, and the row's settings. TP_TRAIN_LIMIT: seconds per row (default 240);
# TP_TRAIN_CONFIG: another configuration to train (tests/test_tp_train_script.py uses a tiny one).
set -uo pipefail
lathe=${1:?usage: tp_train.sh LATHE CORPUS.txt TOKENIZER.json OUT ROW...}
corpus=${2:?corpus}
tok=${3:?tokenizer}
out=${4:?out}
shift 4
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
steps=${TP_TRAIN_STEPS:-6}
limit=${TP_TRAIN_LIMIT:-240}
mkdir -p "$out"
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT
"$lathe" prepare --tokenizer "$tok" --input "$corpus" --format text-blocks --on-error skip \
  --append-eod --output-prefix "$data/corpus" --no-progress >"$out/prepare.log" 2>&1 ||
  { echo "tp_train: prepare failed (see $out/prepare.log)"; exit 1; }
for row in "$@"; do
  IFS=: read -r name gpus sets <<<"$row"
  args=(--set "data.path=$data/corpus" --set "data.tokenizer=$tok")
  IFS=, read -ra kv <<<"${sets:-}"
  for s in "${kv[@]}"; do [[ -n $s ]] && args+=(--set "$s"); done
  run="$data/run-$name"
  setsid "$lathe" launch --gpus "$gpus" -- "$lathe" train "${TP_TRAIN_CONFIG:-$root/configs/llama3-8b-speed.yaml}" \
    --run-dir "$run" "${args[@]}" >"$out/$name.log" 2>&1 &
  pid=$!
  t0=$SECONDS
  while kill -0 "$pid" 2>/dev/null && ((SECONDS - t0 < limit)); do
    [[ -f $run/metrics.jsonl ]] && (($(grep -cE '"split": ?"train"' "$run/metrics.jsonl") >= steps)) && break
    sleep 1
  done
  kill -KILL -- "-$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  cp "$run/metrics.jsonl" "$out/$name.metrics.jsonl" 2>/dev/null
  python3 - "$name" "$gpus" "${sets:-}" "$run/metrics.jsonl" "$steps" >>"$out/tp_train.jsonl" <<'PY' ||
import json, sys
name, gpus, sets, path, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
# The first `steps` logged steps (one more may land between the poll and the kill).
lines = [json.loads(l) for l in open(path) if '"split":"train"' in l.replace(" ", "")][:steps]
if len(lines) < 4:
    raise SystemExit(f"tp_train: {name}: {len(lines)} logged steps")
tokens_per_step = lines[0]["tokens"] // lines[0]["step"]
# The trainer's tokens_per_s at step n is n * tokens_per_step / t_n (since its start).
t = [l["step"] * tokens_per_step / l["tokens_per_s"] for l in lines]
a, b = 2, len(lines) - 1
tok_s = (lines[b]["step"] - lines[a]["step"]) * tokens_per_step / (t[b] - t[a])
mfu = lines[b]["mfu"] * tok_s / lines[b]["tokens_per_s"] if "mfu" in lines[b] else None
print(json.dumps({"row": name, "gpus": gpus, "sets": sets, "tokens_per_s": round(tok_s, 1),
                  "tokens_per_s_per_gpu": round(tok_s / gpus, 1),
                  "mfu": round(mfu, 4) if mfu is not None else None,
                  "step_s": round((t[b] - t[a]) / (lines[b]["step"] - lines[a]["step"]), 4),
                  "memory_bytes": max(l.get("memory_bytes", 0) for l in lines),
                  "steps_timed": lines[b]["step"] - lines[a]["step"]}))
PY
    echo "tp_train: $name: no figures (see $out/$name.log)"
  echo "tp_train: $name: $(tail -1 "$out/tp_train.jsonl" 2>/dev/null)"
done

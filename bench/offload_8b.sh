#!/usr/bin/env bash
# The optimizer-offload reference job on one GPU of the GPU machine: `lathe bench --offload cpu`
# rows, each a JSON line in OUT/<row>.json (its log in OUT/<row>.log), all in OUT/rows.jsonl.
#
#   bench/offload_8b.sh OUT        (LATHE: the lathe binary, default build/lathe; MEMINFO: the
#                                   meminfo file to read, default /proc/meminfo; OFFLOAD_SCHEDULE:
#                                   the rows' --offload-schedule, serial, overlapped or delayed,
#                                   unset for lathe bench's default, overlapped)
#
# Rows:
#   8b-bf16, 8b-fp8   the Llama-3.1-8B shape (preset llama3-8b, 32 layers), T 4096, 24 sequences
#                     (98,304 tokens) a step, --precision bf16 and fp8 (tensorwise), 1 warmup + 2
#                     timed steps
#   13b-bf16          the Llama-2-13B shape (preset llama2-13b), T 2048, 8 sequences a step
# Each row takes the first setting, in this order, whose plan fits: the schedule (recompute,
# micro-batch B, accumulation K with B K the row's sequences: 8B selective B 1 x 24, then full
# recompute B 6 x 4, 4 x 6, 2 x 12; 13B selective 1 x 8, full 2 x 4, 1 x 8), then the moments
# (--state-dtype bf16 before fp32: bf16 moments take 14 B a parameter of pinned host memory and
# fewer bytes in the CPU's update, fp32 18 B), and, where `lathe bench` has --offload-fraction, the
# fractions 0.5, 0.6, 0.7, 0.8, 0.9, 1 (the smallest first: the more of the optimizer on the GPU,
# the less the step waits for the host's update; docs/PERF.md "Less recompute at smaller
# micro-batches"); with OFFLOAD_SCHEDULE=delayed the fraction 1 alone, the one that schedule
# takes (its update, one step behind, hides the host's step: docs/SFT.md). "Fits" is `lathe
# bench --plan-only`'s plan_bytes within the GPU's free memory
# (nvidia-smi) less 2 % and its host_pinned_bytes within MemAvailable (/proc/meminfo) less 4 GiB
# for the process itself. A setting whose run fails (`lathe bench` refuses a plan above the
# device's free memory or the host's, or runs out of memory) hands over to the next while the
# row's time lasts. A row without a setting that ran is written as {"row": ..., "error": ...} with
# the last failure's message.
#
# A row that ran is `lathe bench`'s JSON line with "row" (its name) and "wall_s" (the run's seconds,
# the host's pinning and the initialization included) added.
#
# Time: each row runs under `timeout` (8b-bf16 225 s, 8b-fp8 215 s, 13b-bf16 what is left, and
# never past 535 s after the start), so the script ends within 540 s. The 8B rows take the most:
# pinning up to 105 GiB and initializing 8e9 parameters on the host come before the 3 steps.
set -u
OUT=${1:?usage: bench/offload_8b.sh OUT_DIR (LATHE=path/to/lathe)}
LATHE=${LATHE:-build/lathe}
# Checked before OUT is made: a bad value leaves nothing behind.
SCHEDULE_ARGS=()
case "${OFFLOAD_SCHEDULE:-}" in
    "") ;;
    serial | overlapped | delayed) SCHEDULE_ARGS=(--offload-schedule "$OFFLOAD_SCHEDULE") ;;
    *)
        echo "offload_8b.sh: error: OFFLOAD_SCHEDULE=$OFFLOAD_SCHEDULE: choose serial, overlapped or delayed" >&2
        exit 2
        ;;
esac
mkdir -p "$OUT"
: >"$OUT/rows.jsonl"
START=$(date +%s)
DEADLINE=$((START + 535))

if [ ! -x "$LATHE" ]; then
    echo "offload_8b.sh: error: LATHE=$LATHE is not an executable; build lathe or set LATHE" >&2
    exit 2
fi

# The GPU's free memory and the host's available memory, in bytes.
gpu_free_bytes() {
    local mib
    mib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits -i 0 2>/dev/null | head -1)
    [ -n "$mib" ] && echo $((mib * 1048576)) || echo 0
}
host_available_bytes() {
    awk '/^MemAvailable:/ {printf "%.0f\n", $2 * 1024}' "${MEMINFO:-/proc/meminfo}"
}
# json_field FILE KEY: the value of a top-level key of the one JSON line in FILE ("" if none).
json_field() {
    python3 -c 'import json,sys
try:
    v = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]).get(sys.argv[2], "")
except Exception:
    v = ""
print("" if v is None else v)' "$1" "$2"
}

FRACTIONS="1"
if [ "${OFFLOAD_SCHEDULE:-}" != delayed ] &&
    "$LATHE" bench --help 2>/dev/null | grep -q -- "--offload-fraction"; then
    FRACTIONS="0.5 0.6 0.7 0.8 0.9 1"
fi

# run_row NAME ROW_TIMEOUT SETTINGS -- BENCH_ARGS...   (SETTINGS: "RECOMPUTE:B:K ...")
run_row() {
    local name=$1 budget=$2 settings=$3
    shift 4
    local row_end=$(($(date +%s) + budget))
    [ "$row_end" -gt "$DEADLINE" ] && row_end=$DEADLINE
    local gpu host err least_host=""
    # Where nothing fits, the error names the plan that asks the least of the host.
    local delayed_note=""
    [ "${OFFLOAD_SCHEDULE:-}" = delayed ] &&
        delayed_note=" (OFFLOAD_SCHEDULE=delayed tries the offload fraction 1 alone)"
    err="no setting's plan fits: the GPU has $(gpu_free_bytes) B free, the host $(host_available_bytes) B available"
    local log="$OUT/$name.log" json="$OUT/$name.json" plan="$OUT/$name.plan.json"
    : >"$log"
    for setting in $settings; do
        local recompute b k
        IFS=: read -r recompute b k <<<"$setting"
        for dtype in bf16 fp32; do
            for f in $FRACTIONS; do
                local fraction_args=()
                [ "$FRACTIONS" != "1" ] && fraction_args=(--offload-fraction "$f")
                local args=("$@" --recompute "$recompute" --batch "$b" --accum "$k" --offload cpu
                    --state-dtype "$dtype" "${SCHEDULE_ARGS[@]}" "${fraction_args[@]}")
                if ! "$LATHE" bench "${args[@]}" --device cuda --plan-only >"$plan" 2>>"$log"; then
                    err="plan of ${args[*]} failed (see $name.log)"
                    continue
                fi
                gpu=$(gpu_free_bytes)
                host=$(host_available_bytes)
                local need_gpu need_host
                need_gpu=$(json_field "$plan" plan_bytes)
                need_host=$(json_field "$plan" host_pinned_bytes)
                if ! python3 -c 'import sys; g, h, ng, nh = map(float, sys.argv[1:5]); sys.exit(0 if ng <= 0.98 * g and nh <= h - 4 * 2**30 else 1)' \
                    "$gpu" "$host" "$need_gpu" "${need_host:-0}"; then
                    echo "offload_8b.sh: $name: ${args[*]}: plan $need_gpu B GPU (free $gpu), $need_host B pinned host (available $host): does not fit" >>"$log"
                    if [ -z "$least_host" ] || [ "${need_host:-0}" -lt "$least_host" ]; then
                        least_host=${need_host:-0}
                        err="no setting's plan fits: the GPU has $gpu B free, the host $host B available; the plan asking the least of the host (${args[*]}) needs $need_gpu B of the GPU and $need_host B of pinned host memory$delayed_note"
                    fi
                    continue
                fi
                local left=$((row_end - $(date +%s)))
                if [ "$left" -lt 20 ]; then
                    err="${err}; out of the row's time before ${args[*]}"
                    break 3
                fi
                echo "offload_8b.sh: $name: running ${args[*]} (timeout ${left} s)" | tee -a "$log" >&2
                local t0
                t0=$(date +%s)
                timeout --signal=TERM --kill-after=10 "$left" "$LATHE" bench "${args[@]}" --device cuda \
                    >"$json.tmp" 2>>"$log"
                local rc=$?
                if [ "$rc" -eq 0 ]; then
                    python3 -c 'import json,sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
r["row"], r["wall_s"] = sys.argv[2], int(sys.argv[3])
print(json.dumps(r))' "$json.tmp" "$name" $(($(date +%s) - t0)) >"$json"
                    rm -f "$json.tmp"
                    cat "$json" >>"$OUT/rows.jsonl"
                    return 0
                fi
                rm -f "$json.tmp"
                err="${args[*]} exited $rc: $(grep -h 'error' "$log" | tail -1)"
                [ "$rc" -eq 124 ] && err="${args[*]} ran past its ${left} s"
            done
        done
    done
    python3 -c 'import json,sys; print(json.dumps({"row": sys.argv[1], "error": sys.argv[2]}))' \
        "$name" "$err" | tee "$json" >>"$OUT/rows.jsonl"
    return 1
}

COMMON=(--steps 2 --warmup 1)
S8="selective:1:24 full:6:4 full:4:6 full:2:12"
run_row 8b-bf16 225 "$S8" -- --preset llama3-8b --seq 4096 "${COMMON[@]}"
run_row 8b-fp8 215 "$S8" -- --preset llama3-8b --seq 4096 "${COMMON[@]}" --precision fp8
run_row 13b-bf16 535 "selective:1:8 full:2:4 full:1:8" -- --preset llama2-13b --seq 2048 "${COMMON[@]}"
echo "offload_8b.sh: done in $(($(date +%s) - START)) s; rows in $OUT/rows.jsonl" >&2
cat "$OUT/rows.jsonl"

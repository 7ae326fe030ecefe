#!/usr/bin/env bash
# What one call on the lent GPU machine runs: the gpu-labelled tests, the benchmarks side by side
# with PyTorch, and the GPU-vs-CPU training curve, from the binaries scripts/gpu-bundle.sh packed.
#
#   here:  scripts/gpu-bundle.sh pack; cp ../shared/bench/torch_baseline.py .carry/bench/
#          (the training data: .carry/train/{gcide.bin,gcide.idx,tokenizer.json}, any lathe
#          prepare output)
#   there: bash scripts/gpu-check.sh OUT PART...   (run tool: carry .carry/gpu-bundle.tgz,
#          .carry/bench, .carry/train, .deps/cudnn-frontend not needed: the binaries are built)
#
# PARTs, in the order given:
#   doctor     lathe doctor
#   tests      ops_gpu_tests, model_gpu_tests (GPU vs CPU, GPU vs transformers), align_gpu_tests
#   bench      lathe bench at the issue's two shapes
#   baseline   ../shared/bench/torch_baseline.py gpt2 llama1b (eager and torch.compile)
#   profile    ncu kernel times of one step at both shapes
#   curve      lathe train configs/tiny.yaml on the GPU and on the CPU (all cores), same data and
#              seed: the two metrics.jsonl loss curves side by side
# Each part writes OUT/<part>*.txt; a summary of every part is printed at the end.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# Only a handful of files come back from the device tool's OUT folder, so every part writes into a
# local folder and OUT gets one archive of it (gpu-check.tgz) plus the printed summary.
final_out=${1:?usage: gpu-check.sh OUT PART...}
shift
out=/tmp/gpu-check-out
rm -rf "$out"
mkdir -p "$out" "$final_out"
dir=/tmp/lathe-gpu
lib=$(bash "$root/scripts/gpu-bundle.sh" unpack "$dir")
export LD_LIBRARY_PATH=$lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export LATHE_SOURCE_DIR=$root
bin=$dir/bin
cd "$root"

for part in "$@"; do
    case $part in
        doctor)
            nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
                --format=csv >"$out/doctor.txt" 2>&1
            "$bin/lathe" doctor >>"$out/doctor.txt" 2>&1
            echo "rc=$?" >>"$out/doctor.txt"
            ;;
        tests)
            for t in ops_gpu_tests model_gpu_tests align_gpu_tests; do
                [[ -x $bin/$t ]] || continue
                timeout 300 "$bin/$t" >"$out/tests_$t.txt" 2>&1
                echo "rc=$?" >>"$out/tests_$t.txt"
            done
            ;;
        bench)
            timeout 150 "$bin/lathe" bench --model gpt2-124m --vocab-size 50304 --batch 32 --seq 1024 \
                --steps 20 >"$out/bench_gpt2.txt" 2>&1
            timeout 150 "$bin/lathe" bench --model llama-1b --batch 8 --seq 2048 --steps 10 \
                >"$out/bench_llama.txt" 2>&1
            # The same with the nondeterministic attention backward (PyTorch's flash kind).
            timeout 150 "$bin/lathe" bench --model gpt2-124m --vocab-size 50304 --batch 32 --seq 1024 \
                --steps 20 --nondeterministic >"$out/bench_gpt2_nondet.txt" 2>&1
            timeout 150 "$bin/lathe" bench --model llama-1b --batch 8 --seq 2048 --steps 10 \
                --nondeterministic >"$out/bench_llama_nondet.txt" 2>&1
            for r in selective; do
                timeout 150 "$bin/lathe" bench --model llama-1b --batch 8 --seq 2048 --steps 10 \
                    --recompute $r >"$out/bench_llama_recompute_$r.txt" 2>&1
            done
            timeout 150 "$bin/lathe" bench --model gpt2-124m --vocab-size 50304 --batch 32 --seq 1024 \
                --steps 20 --recompute selective >"$out/bench_gpt2_recompute_selective.txt" 2>&1
            ;;
        profile)
            # Kernel times of one GPT-2 and one Llama-1B step (ncu, clocks left alone).
            for m in "gpt2-124m --vocab-size 50304 --batch 32 --seq 1024" "llama-1b --batch 8 --seq 2048"; do
                name=${m%% *}
                timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
                    --log-file "$out/profile_$name.csv" "$bin/lathe" bench --model $m --steps 1 \
                    --warmup 0 >"$out/profile_$name.txt" 2>&1
                echo "rc=$?" >>"$out/profile_$name.txt"
                python3 scripts/ncu-summary.py "$out/profile_$name.csv" 25 >"$out/profile_${name}_top.txt" 2>&1
            done
            ;;
        baseline)
            timeout 400 python3 .carry/bench/torch_baseline.py gpt2 llama1b >"$out/baseline.txt" 2>&1
            echo "rc=$?" >>"$out/baseline.txt"
            ;;
        curve)
            rm -f .carry/train/*indexmap*
            for dev in cuda cpu; do
                timeout 240 "$bin/lathe" train configs/tiny.yaml --run-dir "$dir/curve-$dev" \
                    --set data.path=.carry/train/gcide --set data.tokenizer=.carry/train/tokenizer.json \
                    --set train.device=$dev --set train.steps=200 --set train.eval_interval=50 \
                    --set checkpoint.interval=0 >"$out/curve_$dev.txt" 2>&1
                echo "rc=$?" >>"$out/curve_$dev.txt"
                cp "$dir/curve-$dev/metrics.jsonl" "$out/curve_$dev.jsonl" 2>/dev/null
            done
            ;;
        *) echo "gpu-check: unknown part '$part'" >&2 ;;
    esac
done

echo "== summary"
for f in "$out"/*.txt; do
    echo "-- $(basename "$f")"
    case $f in
        *_top.txt) cut -c1-140 "$f" ;;
        *) grep -E "^rc=|PASSED|FAILED|ready|tokens_per_s|\[gpu|\[fusion\]|gemm: cuBLASLt|gpt2_124M|llama_1B|step 200/|validation" "$f" |
            cut -c1-400 | tail -40 ;;
    esac
done
tar czf "$final_out/gpu-check.tgz" -C "$out" .

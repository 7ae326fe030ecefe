#!/usr/bin/env bash
# The GPU check: what one call on the lent GPU machine runs, from the binaries that
# scripts/gpu-bundle.sh packed here, ending in ONE verdict line and an exit status:
#
#   gpu-check: PASS (doctor gpu_ready, ops_gpu_tests 98/98, ..., bench 8/8 rows, resume exact ...)
#   gpu-check: FAIL (...what failed first..., then everything else)        exit status 1
#
#   here:  scripts/gpu-bundle.sh pack          (builds lathe and the *_gpu_tests for sm_90a)
#   there: bash scripts/gpu-check.sh OUT [PART...]      (run tool: carry .carry/gpu-bundle.tgz)
#
# PARTs, in the order given (default: doctor tests bench resume, the checked set):
#   doctor     lathe doctor --json must say gpu_ready
#   tests      ops_gpu_tests, model_gpu_tests, align_gpu_tests, dist_gpu_tests, optim_gpu_tests, infer_gpu_tests,
#              run_gpu_tests: each
#              must be there and pass every test it ran, with none skipped (on the GPU machine nothing has
#              a reason to skip; dist_two_gpu_tests needs two GPUs: the dist part runs it)
#   bench      lathe bench at the training shapes (GPT-2 124M B32 T1024, Llama-1B B8 T2048;
#              deterministic and not; selective and full recompute): every row must print its
#              JSON line with tokens_per_s, and the memory plan must lie within +-5% of the
#              measured peak (plan_error, both directions: a plan under the peak fails too)
#   resume     lathe train on the device with gradient accumulation 2: a reference run, and a run
#              SIGKILLed two to four times, each time after a checkpoint (at least once with later
#              steps logged), and restarted with the same command; metrics.jsonl (less
#              tokens_per_s) and every file of the final checkpoint must equal the reference's,
#              bit for bit
#   baseline   .carry/bench/torch_baseline.py gpt2 llama1b (PyTorch eager and torch.compile)
#   profile    ncu kernel times of one step at both shapes
#   curve      lathe train configs/tiny.yaml on the GPU and on the CPU (all cores), same data
#              (.carry/train/{gcide.bin,gcide.idx,tokenizer.json}) and seed, the two loss curves
#   sanitize   compute-sanitizer on ops_gpu_tests: memcheck over the tests (less those that abort
#              on purpose or run the training shapes), racecheck over the tests of the kernels
#              that use shared memory; memcheck 0 errors, racecheck no hazard outside cuBLASLt's
#              own kernels (nvjet_*)
#   opsbench   cuda_ops_bench: each CUDA op's time at the training shapes against its floor
#   compare    the gpt2 and llama bench rows from .carry/before-bundle.tgz (the code before a
#              change, packed the same way and renamed) and from the bundle, alternating, two
#              rounds: each run's tokens/s and after/before of the two medians
#   scaling    data parallel on N = 1, 2, 4 GPUs (those of nvidia-smi -L): `lathe launch --gpus N
#              lathe bench` at GPT-2 124M (B32 T1024 per GPU; --zero-stage 1 and 0) and Llama-1B
#              (B8 T2048 per GPU; --zero-stage 1), .carry/bench/ddp_baseline.py (PyTorch DDP +
#              compile) and bench/fsdp2_baseline.py (FSDP2 + compile) under torchrun
#              --nproc_per_node N; a table (scaling.txt, also in OUT): tokens/s total and per GPU,
#              efficiency (total at N / (N x total at 1)), lathe/DDP and lathe/FSDP2 at each N.
#              Every row must print its line (lathe's with world_size N); the speed goals
#              (efficiency >= 95%, ahead of DDP and FSDP2) are reported, not failed.
#              GPU_CHECK_SCALING_MODELS (default "gpt2 llama") picks the models: one call of
#              600 s holds about one model's rows on 1, 2 and 4 GPUs, so take one model a call
#   dist       on a machine of 2 GPUs or more: dist_two_gpu_tests and infer_two_gpu_tests (NCCL
#              across two GPUs) and the GPU cases of tests/test_data_parallel.py and
#              tests/test_tensor_parallel.py, or of each file
#              GPU_CHECK_DIST_TESTS names (pytest -k gpus; their CPU cases need
#              mpirun and run in CI) with LATHE_BIN the bundle's lathe; every test must pass, none
#              skipped. pytest is the machine's, else installed from wheels carried in
#              .carry/wheels/; the tests' corpus, Debian's /usr/share/dictd/gcide.dict.dz, is
#              installed from .carry/dictd/gcide.dict.dz where the machine lacks it (a prefix is
#              enough: zcat /usr/share/dictd/gcide.dict.dz | head -c 4000000 | gzip)
# baseline, profile, curve, opsbench, compare and scaling are measurements; they fail the check only
# when a command does (scaling: or a row is missing). scaling and dist run only when named.
#
# Every part writes its logs into a work folder; OUT gets verdict.txt and one archive of the logs
# (gpu-check.tgz), since the run tool brings back only a few files.
#
# Environment (for runs of this script's logic off the GPU machine; tests/test_gpu_check_script.py):
#   GPU_CHECK_BIN     a folder holding lathe and the test binaries (no bundle is unpacked)
#   GPU_CHECK_BEFORE_BIN  likewise for the compare part's "before" lathe
#   GPU_CHECK_DEVICE  train.device of the resume part (default cuda)
#   GPU_CHECK_RESUME_SETS  extra --set key=value words for the resume part's runs (a smaller model)
#   GPU_CHECK_RESUME_STEPS, GPU_CHECK_RESUME_EVERY  its train.steps (300) and checkpoint.interval (20)
#   GPU_CHECK_BUDGET  seconds the whole check may take (default 540: one 600 s device call)
#   GPU_CHECK_SCALING_MODELS  the scaling part's models (gpt2 llama); GPU_CHECK_SCALING_N its
#                     GPU counts (default 1 2 4, those the machine has)
#   GPU_CHECK_TORCH_BENCH  the folder of ddp_baseline.py and torch_baseline.py (.carry/bench)
#   GPU_CHECK_TORCHRUN  the torchrun command (python3 -m torch.distributed.run)
#   GPU_CHECK_TESTS   the tests part's binaries (default: the seven *_gpu_tests above)
#   GPU_CHECK_DIST_TESTS  the dist part's pytest files (tests/test_data_parallel.py
#                     tests/test_tensor_parallel.py);
#                     GPU_CHECK_DIST_PYTEST_ARGS  its selection (default -k gpus)
set -uo pipefail

# NVLink multicast stays off on the shared multi-GPU machines (NCCL, PyTorch, NVSHMEM): a program
# that uses it can put the host's GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

root=$(cd "$(dirname "$0")/.." && pwd)
final_out=${1:?usage: gpu-check.sh OUT [PART...]}
shift
parts=("$@")
((${#parts[@]})) || parts=(doctor tests bench resume)

work=$(mktemp -d /tmp/gpu-check.XXXXXX)
out=$work/logs
mkdir -p "$out" "$final_out"
final_out=$(cd "$final_out" && pwd)
device=${GPU_CHECK_DEVICE:-cuda}
deadline=$((SECONDS + ${GPU_CHECK_BUDGET:-540}))
cd "$root" || exit 1

results=()  # one "PASS|what" or "FAIL|what" per check, in order
pass() { results+=("PASS|$*"); echo "gpu-check: ok: $*"; }
fail() { results+=("FAIL|$*"); echo "gpu-check: FAILED: $*"; }

# Seconds a step may take: its own limit, never past the check's deadline.
limit() {
    local left=$((deadline - SECONDS))
    ((left < 1)) && left=1
    echo $(($1 < left ? $1 : left))
}

# The binaries: a given folder, or the bundle unpacked.
if [[ -n ${GPU_CHECK_BIN:-} ]]; then
    bin=$GPU_CHECK_BIN
else
    bin=$work/bundle/bin
    if [[ -f $root/.carry/gpu-bundle.tgz ]]; then
        lib=$(bash "$root/scripts/gpu-bundle.sh" unpack "$work/bundle")
        export LD_LIBRARY_PATH=$lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
    else
        fail "bundle: .carry/gpu-bundle.tgz missing (run scripts/gpu-bundle.sh pack here, carry .carry/gpu-bundle.tgz)"
    fi
fi
export LATHE_SOURCE_DIR=$root
lathe=$bin/lathe

have() {
    [[ -x $bin/$1 ]] && return 0
    fail "$1: binary missing from $bin"
    return 1
}

# A JSON field of the last line of FILE that is a JSON object ("" when absent or null).
json_field() {
    python3 - "$1" "$2" <<'EOF'
import json, sys
obj = None
for line in open(sys.argv[1], errors="replace"):
    line = line.strip()
    if line.startswith("{"):
        try:
            obj = json.loads(line)
        except ValueError:
            pass
v = None if obj is None else obj.get(sys.argv[2])
print("" if v is None else v)
EOF
}

# The last line of a log less the "rc=" line the parts append, cut to 160 characters.
last_line() {
    grep -v '^rc=' "$1" | tail -1 | cut -c1-160
}

part_doctor() {
    have lathe || return
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
        --format=csv >"$out/doctor.txt" 2>&1
    timeout "$(limit 120)" "$lathe" doctor >>"$out/doctor.txt" 2>&1
    timeout "$(limit 120)" "$lathe" doctor --json >"$out/doctor.json" 2>>"$out/doctor.txt"
    local rc=$? status
    status=$(json_field "$out/doctor.json" status)
    if [[ $rc -eq 0 && $status == gpu_ready ]]; then
        pass "doctor gpu_ready"
    else
        fail "doctor: exit $rc, status '${status:-none}' ($(json_field "$out/doctor.json" verdict))"
    fi
}

# One GoogleTest binary: PASS only when it exited 0 and every test it ran passed, none skipped.
gtest_verdict() {
    local t=$1 log=$2 rc=$3 ran passed failed skipped
    ran=$(sed -n 's/^\[==========\] \([0-9]*\) tests\? from .* ran\..*/\1/p' "$log" | tail -1)
    passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\?\..*/\1/p' "$log" | tail -1)
    failed=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) tests\?, listed below.*/\1/p' "$log" | tail -1)
    skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\?, listed below.*/\1/p' "$log" | tail -1)
    failed=${failed:-0} skipped=${skipped:-0}
    if [[ -z $ran ]]; then
        local why="exit $rc"
        ((rc == 124)) && why="timed out"
        fail "$t: no summary ($why; last line: $(last_line "$log"))"
    elif [[ $rc -eq 0 && ${passed:-0} -eq $ran && $ran -gt 0 && $failed -eq 0 && $skipped -eq 0 ]]; then
        pass "$t $passed/$ran"
    else
        local names
        names=$(grep -E '^\[  (FAILED|SKIPPED) +\] [A-Za-z]' "$log" | sed 's/^\[ *[A-Z]* *\] //; s/ (.*//' |
            sort -u | head -5 | tr '\n' ' ')
        fail "$t ${passed:-0}/$ran (exit $rc, $failed failed, $skipped skipped: ${names% })"
    fi
}

part_tests() {
    local t rc
    # shellcheck disable=SC2086  # a list of names
    for t in ${GPU_CHECK_TESTS:-ops_gpu_tests model_gpu_tests align_gpu_tests dist_gpu_tests optim_gpu_tests infer_gpu_tests run_gpu_tests}; do
        have "$t" || continue
        timeout "$(limit 300)" "$bin/$t" >"$out/tests_$t.txt" 2>&1
        rc=$?
        echo "rc=$rc" >>"$out/tests_$t.txt"
        gtest_verdict "$t" "$out/tests_$t.txt" "$rc"
    done
}

# name|arguments of lathe bench: the training shapes and their variants.
bench_rows=(
    "gpt2|--model gpt2-124m --vocab-size 50304 --batch 32 --seq 1024 --steps 20"
    "llama|--model llama-1b --batch 8 --seq 2048 --steps 10"
    "gpt2_nondet|--model gpt2-124m --vocab-size 50304 --batch 32 --seq 1024 --steps 20 --nondeterministic"
    "llama_nondet|--model llama-1b --batch 8 --seq 2048 --steps 10 --nondeterministic"
    "gpt2_selective|--model gpt2-124m --vocab-size 50304 --batch 32 --seq 1024 --steps 10 --recompute selective"
    "llama_selective|--model llama-1b --batch 8 --seq 2048 --steps 5 --recompute selective"
    "gpt2_full|--model gpt2-124m --vocab-size 50304 --batch 32 --seq 1024 --steps 5 --recompute full"
    "llama_full|--model llama-1b --batch 8 --seq 2048 --steps 5 --recompute full"
)
# The memory plan printed before step 1 against the measured peak: |peak / plan - 1| <= 5%.
plan_tolerance=0.05

# One bench row: LATHE bench ARGS on the GPU, its output and exit status into LOG; prints the
# row's tokens_per_s ("" when its JSON line has none).
bench_row() {
    # shellcheck disable=SC2086  # args are words
    timeout "$(limit 150)" "$1" bench $2 --device cuda >"$3" 2>&1
    echo "rc=$?" >>"$3"
    json_field "$3" tokens_per_s
}

part_bench() {
    have lathe || return
    local row name args log tps err ok=0 errs=()
    for row in "${bench_rows[@]}"; do
        name=${row%%|*} args=${row#*|}
        log=$out/bench_$name.txt
        tps=$(bench_row "$lathe" "$args" "$log")
        err=$(json_field "$log" plan_error)
        if [[ -z $tps ]]; then
            fail "bench $name: no tokens_per_s (last line: $(last_line "$log"); $(tail -1 "$log"))"
        elif [[ -z $err ]]; then
            fail "bench $name: no plan_error (measured peak against the plan) in its JSON line"
        elif ! python3 -c "import sys; sys.exit(0 if abs(float('$err')) <= $plan_tolerance else 1)"; then
            fail "bench $name: the plan is off the measured peak by $(printf '%+.1f' "$(python3 -c "print(100 * float('$err'))")")% (allowed +-5%; positive: the plan is short)"
        else
            ok=$((ok + 1))
            errs+=("$err")
        fi
    done
    if ((ok == ${#bench_rows[@]})); then
        pass "bench ${ok}/${#bench_rows[@]} rows, plan error $(python3 -c "import sys; e=[100*float(x) for x in sys.argv[1:]]; print(f'{min(e):+.1f}..{max(e):+.1f}%')" "${errs[@]}")"
    fi
}

# The resume part's training data: the repository's own Markdown (it travels with the tree), one
# JSONL document per paragraph, a byte-level BPE of 512 tokens trained on it, prepared with EOD.
resume_data() {
    local d=$1
    mkdir -p "$d"
    python3 - "$d/corpus.jsonl" README.md docs/*.md docs/formats/*.md <<'EOF' || return 1
import json, sys
with open(sys.argv[1], "w") as out:
    for path in sys.argv[2:]:
        for block in open(path, encoding="utf-8", errors="replace").read().split("\n\n"):
            if block.strip():
                out.write(json.dumps({"text": block.strip()}) + "\n")
EOF
    "$lathe" tokenizer train --vocab-size 512 --special-tokens '<|endoftext|>' \
        --input "$d/corpus.jsonl" --output "$d/tokenizer.json" >>"$out/resume.txt" 2>&1 || return 1
    "$lathe" prepare --tokenizer "$d/tokenizer.json" --input "$d/corpus.jsonl" \
        --output-prefix "$d/docs" --append-eod >>"$out/resume.txt" 2>&1
}

# The newest complete checkpoint's step in RUN (0: none), and the last logged step.
newest_checkpoint() {
    local c newest=0 n
    for c in "$1"/checkpoints/step-*; do
        n=${c##*/step-}
        [[ $n =~ ^[0-9]+$ ]] && ((10#$n > newest)) && newest=$((10#$n))
    done
    echo "$newest"
}
last_logged_step() {
    local line
    line=$(grep '}$' "$1/metrics.jsonl" 2>/dev/null | tail -1)
    [[ $line =~ \"step\":\ ?([0-9]+) ]] && echo "${BASH_REMATCH[1]}" || echo 0
}

part_resume() {
    have lathe || return
    local d=$work/resume steps=${GPU_CHECK_RESUME_STEPS:-300} every=${GPU_CHECK_RESUME_EVERY:-20}
    : >"$out/resume.txt"
    if ! resume_data "$d/data"; then
        fail "resume: could not make the training data (resume.txt)"
        return
    fi
    # shellcheck disable=SC2206  # the extra sets are words
    local cmd=(train configs/tiny.yaml
        --set "data.path=$d/data/docs" --set "data.tokenizer=$d/data/tokenizer.json"
        --set 'data.split=90,10,0' --set "train.device=$device"
        --set "train.steps=$steps" --set train.gradient_accumulation_steps=2
        --set train.log_interval=1 --set train.eval_interval=50 --set train.eval_iters=2
        --set "checkpoint.interval=$every" --set checkpoint.keep_last=2
        ${GPU_CHECK_RESUME_SETS:-})
    if ! timeout "$(limit 120)" "$lathe" "${cmd[@]}" --run-dir "$d/reference" >>"$out/resume.txt" 2>&1; then
        fail "resume: the reference run failed (resume.txt)"
        return
    fi
    # Kills, each once a checkpoint at or past the target is complete and a later step was logged,
    # then a restart with the same command: two kills at least, and until one of them threw
    # logged steps away (a kill can land just after a checkpoint, before the next step is
    # logged; then the rerun's truncation of metrics.jsonl is not exercised), four at most.
    local run=$d/killed target=$every pid ckpt at rc lost=0 kills=()
    while ((${#kills[@]} < 2 || (!lost && ${#kills[@]} < 4))); do
        "$lathe" "${cmd[@]}" --run-dir "$run" >>"$out/resume.txt" 2>&1 &
        pid=$!
        local stop=$(($(limit 120) + SECONDS))
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < stop)); do
            ckpt=$(newest_checkpoint "$run")
            if ((ckpt >= target)) && (($(last_logged_step "$run") > ckpt)); then
                kill -KILL "$pid"
                break
            fi
            sleep 0.01
        done
        wait "$pid" 2>/dev/null
        rc=$?
        at=$(last_logged_step "$run")
        ckpt=$(newest_checkpoint "$run")
        echo "resume: exit $rc after logged step $at, newest checkpoint $ckpt" >>"$out/resume.txt"
        if ((rc != 137 || ckpt < target || ckpt >= steps)); then
            fail "resume: the run was not SIGKILLed between checkpoint $target and the end (exit $rc, logged step $at, newest checkpoint $ckpt): nothing was tested"
            return
        fi
        kills+=("$at/$ckpt")
        ((at > ckpt)) && lost=1
        target=$((ckpt + 2 * every))
    done
    if ((!lost)); then
        fail "resume: no kill threw logged steps away (step/checkpoint ${kills[*]}): the rerun's redo of lost steps was not tested"
        return
    fi
    if ! timeout "$(limit 120)" "$lathe" "${cmd[@]}" --run-dir "$run" >>"$out/resume.txt" 2>&1; then
        fail "resume: the restarted run failed (resume.txt)"
        return
    fi
    cp "$d/reference/metrics.jsonl" "$out/resume_reference.jsonl" 2>/dev/null
    cp "$run/metrics.jsonl" "$out/resume_killed.jsonl" 2>/dev/null
    local diff
    diff=$(python3 - "$d/reference/metrics.jsonl" "$run/metrics.jsonl" <<'EOF'
import json, sys
def lines(path):
    out = []
    for line in open(path):
        j = json.loads(line)
        for measured in ("tokens_per_s", "mfu", "memory_bytes"):  # timing and memory, not results
            j.pop(measured, None)
        out.append(j)
    return out
a, b = lines(sys.argv[1]), lines(sys.argv[2])
if len(a) != len(b):
    print(f"{len(b)} metrics lines against the reference's {len(a)}")
for x, y in zip(a, b):
    if x != y:
        print(f"first difference: {json.dumps(y)} against {json.dumps(x)}")
        break
else:
    if len(a) == len(b):
        print("equal")
EOF
)
    local final
    final=$(printf 'step-%08d' "$steps")
    local files=0 differ=()
    for f in "$d/reference/checkpoints/$final"/*; do
        files=$((files + 1))
        cmp -s "$f" "$run/checkpoints/$final/$(basename "$f")" || differ+=("$(basename "$f")")
    done
    if [[ ! -d $d/reference/checkpoints/$final ]]; then
        fail "resume: the reference run has no $final"
    elif [[ $diff != equal ]]; then
        fail "resume: metrics.jsonl differs from the uninterrupted run's: ${diff:-not compared}"
    elif ((${#differ[@]})); then
        fail "resume: $final differs from the uninterrupted run's in ${differ[*]}"
    else
        pass "resume exact on $device (killed after step/checkpoint ${kills[*]}; $(wc -l <"$run/metrics.jsonl") metrics lines, $files checkpoint files equal)"
    fi
}

part_baseline() {
    if [[ ! -f .carry/bench/torch_baseline.py ]]; then
        fail "baseline: .carry/bench/torch_baseline.py missing (cp ../shared/bench/torch_baseline.py .carry/bench/)"
        return
    fi
    timeout "$(limit 400)" python3 .carry/bench/torch_baseline.py gpt2 llama1b >"$out/baseline.txt" 2>&1
    local rc=$?
    echo "rc=$rc" >>"$out/baseline.txt"
    ((rc == 0)) && pass "baseline" || fail "baseline: exit $rc"
}

part_profile() {
    have lathe || return
    local m name rc
    for m in "gpt2-124m --vocab-size 50304 --batch 32 --seq 1024" "llama-1b --batch 8 --seq 2048"; do
        name=${m%% *}
        # shellcheck disable=SC2086
        timeout "$(limit 200)" ncu --clock-control none --metrics gpu__time_duration.sum --csv \
            --log-file "$out/profile_$name.csv" "$lathe" bench --model $m --steps 1 \
            --warmup 0 >"$out/profile_$name.txt" 2>&1
        rc=$?
        echo "rc=$rc" >>"$out/profile_$name.txt"
        python3 scripts/ncu-summary.py "$out/profile_$name.csv" 25 >"$out/profile_${name}_top.txt" 2>&1
        ((rc == 0)) && pass "profile $name" || fail "profile $name: exit $rc"
    done
}

part_sanitize() {
    have ops_gpu_tests || return
    local san rc errors
    san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    if [[ ! -x $san ]]; then
        fail "sanitize: compute-sanitizer not found"
        return
    fi
    # Left out: death tests (they abort on purpose), the training-shape and determinism tests and
    # the 67-graph cache bound (minutes under the sanitizer, the same kernels as smaller cases).
    timeout "$(limit 420)" "$san" --tool memcheck --leak-check no --error-exitcode 9 \
        "$bin/ops_gpu_tests" --gtest_filter='-*DeathTest*:*Rejects*:*Refuses*:*TrainingShape*:*Deterministic*:*GraphCacheDefaultBound*' \
        >"$out/sanitize_memcheck.txt" 2>&1
    rc=$?
    echo "rc=$rc" >>"$out/sanitize_memcheck.txt"
    errors=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$out/sanitize_memcheck.txt" | tail -1)
    if ((rc == 0)) && [[ $errors == 0 ]]; then pass "memcheck 0 errors"; else fail "memcheck: exit $rc, ${errors:-no} error summary"; fi
    # cuBLASLt's own split-K kernels (nvjet_*) report shared-memory hazards racecheck does not
    # model (docs/CUDA.md, GPU runs); the check is that none is in lathe's kernels. (Excluding
    # nvjet with --kernel-name-exclude made the sanitizer fail on a hardware exception.)
    timeout "$(limit 120)" "$san" --tool racecheck "$bin/ops_gpu_tests" \
        --gtest_filter='CudaLmHeadCrossEntropy.*:CudaEmbedding.*:CudaGradNorm.*' \
        >"$out/sanitize_racecheck.txt" 2>&1
    rc=$?
    echo "rc=$rc" >>"$out/sanitize_racecheck.txt"
    local log=$out/sanitize_racecheck.txt ours theirs
    ours=$(grep -E 'Race reported between' "$log" | grep -vc nvjet)
    theirs=$(grep -E 'Race reported between' "$log" | grep -c nvjet)
    if ((rc != 0)) || grep -q 'Internal Sanitizer Error' "$log" || ! grep -q 'RACECHECK SUMMARY' "$log"; then
        fail "racecheck: exit $rc ($(grep -m1 -E 'Internal Sanitizer Error|internal check failed|FAILED' "$log" | cut -c1-160))"
    elif ((ours > 0)); then
        fail "racecheck: $ours hazard reports in lathe's kernels ($(grep -E 'Race reported between' "$log" | grep -v nvjet | head -1 | cut -c1-160))"
    else
        pass "racecheck 0 hazards in lathe's kernels ($theirs reports inside cuBLASLt's nvjet)"
    fi
}

part_opsbench() {
    have cuda_ops_bench || return
    timeout "$(limit 150)" "$bin/cuda_ops_bench" >"$out/opsbench.txt" 2>&1
    local rc=$?
    echo "rc=$rc" >>"$out/opsbench.txt"
    # Rows of the Markdown table, less its header and separator.
    ((rc == 0)) && pass "opsbench $(grep '^|' "$out/opsbench.txt" | tail -n +3 | wc -l) ops" || fail "opsbench: exit $rc"
}

part_compare() {
    have lathe || return
    # The "before" lathe runs with its own bundle's libraries (LD_LIBRARY_PATH), the bundle's with
    # the bundle's.
    local before_bin=${GPU_CHECK_BEFORE_BIN:-} before_ld=${LD_LIBRARY_PATH:-}
    if [[ -z $before_bin ]]; then
        if [[ ! -f $root/.carry/before-bundle.tgz ]]; then
            fail "compare: .carry/before-bundle.tgz missing (pack the code before the change, rename the bundle, carry it)"
            return
        fi
        local lib
        lib=$(bash "$root/scripts/gpu-bundle.sh" unpack "$work/before" "$root/.carry/before-bundle.tgz")
        before_bin=$work/before/bin
        before_ld=$lib:${LD_LIBRARY_PATH#*:}
    fi
    local row name args round side log tps summary="" ok=1
    local -A runs=()
    for round in 1 2; do
        for row in "${bench_rows[@]:0:2}"; do
            name=${row%%|*} args=${row#*|}
            for side in before after; do
                log=$out/compare_${name}_${side}_$round.txt
                if [[ $side == before ]]; then
                    tps=$(LD_LIBRARY_PATH=$before_ld bench_row "$before_bin/lathe" "$args" "$log")
                else
                    tps=$(bench_row "$lathe" "$args" "$log")
                fi
                if [[ -z $tps ]]; then
                    fail "compare $name $side round $round: no tokens_per_s ($(last_line "$log"))"
                    ok=0
                fi
                runs[$name.$side]+="${tps:-nan} "
            done
        done
    done
    ((ok)) || return
    for row in "${bench_rows[@]:0:2}"; do
        name=${row%%|*}
        summary+=$(python3 - "$name" "${runs[$name.before]}" "${runs[$name.after]}" <<'EOF'
import statistics, sys
name, b, a = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
mb, ma = statistics.median(b), statistics.median(a)
print(f"{name} {ma / mb:.3f}x (before {' '.join(f'{x:.0f}' for x in b)}, after {' '.join(f'{x:.0f}' for x in a)} tok/s); ", end="")
EOF
)
    done
    pass "compare after/before: ${summary%; }"
}

part_curve() {
    have lathe || return
    if [[ ! -f .carry/train/gcide.idx ]]; then
        fail "curve: .carry/train/{gcide.bin,gcide.idx,tokenizer.json} missing"
        return
    fi
    rm -f .carry/train/*indexmap*
    local dev rc
    for dev in cuda cpu; do
        timeout "$(limit 240)" "$lathe" train configs/tiny.yaml --run-dir "$work/curve-$dev" \
            --set data.path=.carry/train/gcide --set data.tokenizer=.carry/train/tokenizer.json \
            --set train.device=$dev --set train.steps=200 --set train.eval_interval=50 \
            --set checkpoint.interval=0 >"$out/curve_$dev.txt" 2>&1
        rc=$?
        echo "rc=$rc" >>"$out/curve_$dev.txt"
        cp "$work/curve-$dev/metrics.jsonl" "$out/curve_$dev.jsonl" 2>/dev/null
        ((rc == 0)) && pass "curve $dev" || fail "curve $dev: exit $rc"
    done
}

# GPUs the driver lists (0 when nvidia-smi is missing or fails), cut to CUDA_VISIBLE_DEVICES's
# entries where that is set (nvidia-smi ignores it; the tests' processes do not).
gpu_count() {
    local n
    n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    if [[ -n ${CUDA_VISIBLE_DEVICES+set} ]]; then
        local v=${CUDA_VISIBLE_DEVICES//[[:space:]]/} m=0 d
        local IFS=,
        for d in $v; do [[ -n $d ]] && m=$((m + 1)); done
        ((m < n)) && n=$m
    fi
    echo "$n"
}

# The scaling part's runs by model: lathe bench's arguments, its ZeRO stages, the PyTorch
# scripts' model name.
declare -A scaling_lathe=(
    [gpt2]="--model gpt2-124m --vocab-size 50304 --batch 32 --seq 1024 --steps 20"
    [llama]="--model llama-1b --batch 8 --seq 2048 --steps 10"
)
declare -A scaling_zero=([gpt2]="1 0" [llama]="1")
declare -A scaling_torch=([gpt2]=gpt2 [llama]=llama1b)

part_scaling() {
    have lathe || return
    local g ns=() n m z who log script extra rows=() fsdp2=$root/bench/fsdp2_baseline.py
    g=$(gpu_count)
    for n in ${GPU_CHECK_SCALING_N:-1 2 4}; do
        ((n <= g)) && ns+=("$n")
    done
    if ((${#ns[@]} == 0)); then
        fail "scaling: nvidia-smi -L lists $g GPUs, none of N = ${GPU_CHECK_SCALING_N:-1 2 4}"
        return
    fi
    local torch_bench=${GPU_CHECK_TORCH_BENCH:-$root/.carry/bench} torch_ok=1
    if [[ ! -f $torch_bench/ddp_baseline.py || ! -f $torch_bench/torch_baseline.py ]]; then
        fail "scaling: $torch_bench/{ddp_baseline.py,torch_baseline.py} missing (cp ../shared/bench/*.py .carry/bench/)"
        torch_ok=0
    fi
    # shellcheck disable=SC2206  # a command of words
    local torchrun=(${GPU_CHECK_TORCHRUN:-python3 -m torch.distributed.run})
    for m in ${GPU_CHECK_SCALING_MODELS:-gpt2 llama}; do
        if [[ -z ${scaling_lathe[$m]:-} ]]; then
            fail "scaling: unknown model '$m' in GPU_CHECK_SCALING_MODELS (gpt2 llama)"
            continue
        fi
        for n in "${ns[@]}"; do
            # A row whose run did not start (the check's time was spent) has no log: missing.
            for z in ${scaling_zero[$m]}; do
                log=$out/scaling_${m}_lathe_z${z}_n$n.txt
                rows+=("$m|lathe_z$z|$n|$log")
                ((SECONDS < deadline)) || continue
                # shellcheck disable=SC2086  # args are words
                timeout "$(limit 180)" "$lathe" launch --gpus "$n" -- "$lathe" bench ${scaling_lathe[$m]} \
                    --zero-stage "$z" --device cuda >"$log" 2>&1
                echo "rc=$?" >>"$log"
            done
            ((torch_ok)) || continue
            for who in ddp fsdp2; do
                log=$out/scaling_${m}_${who}_n$n.txt
                rows+=("$m|$who|$n|$log")
                ((SECONDS < deadline)) || continue
                script=$torch_bench/ddp_baseline.py extra=()
                [[ $who == fsdp2 ]] && script=$fsdp2 extra=(--torch-baseline-dir "$torch_bench")
                timeout "$(limit 300)" "${torchrun[@]}" --standalone --nproc_per_node "$n" "$script" \
                    "${scaling_torch[$m]}" "${extra[@]}" >"$log" 2>&1
                echo "rc=$?" >>"$log"
            done
        done
    done
    ((${#rows[@]})) || return
    local verdict
    verdict=$(python3 - "$out/scaling.txt" "${rows[@]}" <<'EOF'
import json, sys
table_path, rows = sys.argv[1], [r.split("|", 3) for r in sys.argv[2:]]


def last_json(path):
    """The last JSON object line of a log, and what ended the run (for messages)."""
    obj, last, rc = None, "", "?"
    try:
        for line in open(path, errors="replace"):
            line = line.strip()
            if line.startswith("rc="):
                rc = line[3:]
            elif line:
                last = line
            if line.startswith("{"):
                try:
                    obj = json.loads(line)
                except ValueError:
                    pass
    except OSError:
        return None, "not run: the check's time was spent"
    return obj, f"exit {rc}{', timed out' if rc == '124' else ''}{': ' + last[:160] if last else ''}"


got, missing = {}, []
for model, who, n, log in rows:
    n = int(n)
    obj, last = last_json(log)
    name = f"{model} {who.replace('_z', ' zero')} N={n}"
    if obj is None:
        missing.append(f"{name}: no result ({last})")
        continue
    if who.startswith("lathe"):
        world, total = obj.get("world_size"), obj.get("tokens_per_s")
        per = obj.get("tokens_per_s_per_gpu") or (total / n if total else None)
        extra = {"mfu": obj.get("mfu"), "comm_wait_ms": obj.get("comm_wait_ms"),
                 "peak_GiB": (obj.get("peak_memory_bytes") or 0) / 2**30}
        # Each rank's plan (NCCL's measured buffers included) against the fullest GPU's peak, as
        # the bench part checks one GPU's.
        pe = obj.get("plan_error")
        if pe is not None and abs(pe) > 0.05:
            missing.append(f"{name}: memory plan {100 * pe:+.1f}% off the measured peak (limit 5%)")
    else:
        world, total, per = obj.get("world"), obj.get("tok_s_total"), obj.get("tok_s_per_gpu")
        extra = {"mfu": obj.get("mfu"), "peak_GiB": obj.get("mem_GiB")}
    if world != n:
        missing.append(f"{name}: its line says world size {world}, not {n}")
    elif not total or not per:
        missing.append(f"{name}: no tokens/s in its line")
    else:
        got[(model, who, n)] = dict(total=float(total), per=float(per), **extra)


def num(x, spec, unit=""):
    return "-" if x is None else format(x, spec) + unit


lines = ["| model | run | N | tokens/s total | tokens/s per GPU | efficiency | lathe/DDP | lathe/FSDP2 "
         "| MFU | comm wait ms | peak GiB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
goals, summary = [], []
for model in dict.fromkeys(r[0] for r in rows):
    ns = sorted({int(r[2]) for r in rows if r[0] == model})
    eff_s, vs_s = [], {"ddp": [], "fsdp2": []}
    for who in dict.fromkeys(r[1] for r in rows if r[0] == model):
        for n in ns:
            r = got.get((model, who, n))
            if r is None:
                continue
            one = got.get((model, who, 1))
            eff = r["total"] / (n * one["total"]) if one else None
            vs = {b: r["total"] / got[(model, b, n)]["total"]
                  for b in ("ddp", "fsdp2") if who.startswith("lathe") and (model, b, n) in got}
            lines.append(f"| {model} | {who.replace('_z', ' zero ')} | {n} | {r['total']:.0f} | {r['per']:.0f} "
                         f"| {num(eff and 100 * eff, '.1f', '%')} | {num(vs.get('ddp'), '.3f')} "
                         f"| {num(vs.get('fsdp2'), '.3f')} | {num(r.get('mfu'), '.3f')} "
                         f"| {num(r.get('comm_wait_ms'), '.1f')} | {num(r.get('peak_GiB'), '.1f')} |")
            if who != "lathe_z1":
                continue
            if eff is not None and n > 1:
                eff_s.append(f"{n}:{100 * eff:.1f}%")
                if eff < 0.95:
                    goals.append(f"{model} zero 1 efficiency {100 * eff:.1f}% at N={n} (goal 95%)")
            for b, x in vs.items():
                vs_s[b].append(f"{n}:{x:.2f}")
                if x < 1:
                    goals.append(f"{model} zero 1 behind {b.upper()} at N={n} ({x:.3f})")
    summary.append(f"{model} zero 1 efficiency {' '.join(eff_s) or '-'}, lathe/DDP "
                   f"{' '.join(vs_s['ddp']) or '-'}, lathe/FSDP2 {' '.join(vs_s['fsdp2']) or '-'}")
table = "\n".join(lines) + "\n"
if goals:
    table += "\nspeed goals missed: " + "; ".join(goals) + "\n"
open(table_path, "w").write(table)
ok = len(rows) - len(missing)
if missing:
    more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
    print(f"FAIL|scaling {ok}/{len(rows)} rows: {'; '.join(missing[:3])}{more}")
else:
    print(f"PASS|scaling {ok}/{len(rows)} rows: {'; '.join(summary)}; "
          f"{f'{len(goals)} speed goals missed' if goals else 'speed goals met'}")
EOF
)
    cat "$out/scaling.txt"
    cp "$out/scaling.txt" "$final_out/scaling.txt" 2>/dev/null
    case $verdict in
        PASS\|*) pass "${verdict#PASS|}" ;;
        FAIL\|*) fail "${verdict#FAIL|}" ;;
        *) fail "scaling: no table (the summary script printed '${verdict:0:100}')" ;;
    esac
}

# pytest's counts from the summary line of its log ("3 passed, 1 skipped in 2.00s"), as
# "passed failed skipped errors found" (found 0: no summary line).
pytest_counts() {
    python3 - "$1" <<'EOF'
import re, sys
line = ""
for text in open(sys.argv[1], errors="replace"):
    if re.search(r"\b(passed|failed|skipped|errors?|xfailed|xpassed|deselected|no tests ran)\b.* in [0-9.]+s", text):
        line = text
c = dict.fromkeys(("passed", "failed", "skipped", "error", "xfailed", "xpassed"), 0)
for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)\b", line):
    c["error" if k.startswith("error") else k] += int(n)
print(c["passed"], c["failed"] + c["xpassed"], c["skipped"] + c["xfailed"], c["error"], int(bool(line)))
EOF
}

part_dist() {
    local g rc
    g=$(gpu_count)
    if ((g < 2)); then
        fail "dist: needs 2 GPUs or more, nvidia-smi -L lists $g"
        return
    fi
    local t
    for t in dist_two_gpu_tests infer_two_gpu_tests; do
        have "$t" || continue
        timeout "$(limit 200)" "$bin/$t" >"$out/$t.txt" 2>&1
        rc=$?
        echo "rc=$rc" >>"$out/$t.txt"
        gtest_verdict "$t" "$out/$t.txt" "$rc"
    done
    have lathe || return
    local tests
    for tests in ${GPU_CHECK_DIST_TESTS:-tests/test_data_parallel.py tests/test_tensor_parallel.py}; do
        dist_pytest "$tests"
    done
}

# One pytest file of the dist part (its GPU cases), with the corpus and pytest it needs.
dist_pytest() {
    local tests=$1 rc
    local file=${tests##*/}
    local log=$out/dist_pytest_${file%.py}.txt pypath=${PYTHONPATH:-}
    : >"$log"
    if [[ ! -f $tests ]]; then
        fail "dist: $tests missing"
        return
    fi
    local dict=${GPU_CHECK_DICTD:-/usr/share/dictd}/gcide.dict.dz
    if [[ ! -f $dict ]]; then
        if [[ ! -f $root/.carry/dictd/gcide.dict.dz ]] ||
            ! { mkdir -p "${dict%/*}" && cp "$root/.carry/dictd/gcide.dict.dz" "$dict"; } >>"$log" 2>&1; then
            fail "dist: the tests' corpus $dict is missing here (carry .carry/dictd/gcide.dict.dz)"
            return
        fi
    fi
    if ! python3 -c 'import pytest' 2>/dev/null; then
        if compgen -G "$root/.carry/wheels/*.whl" >/dev/null; then
            python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/site" \
                "$root"/.carry/wheels/*.whl >>"$log" 2>&1
            pypath=$work/site${pypath:+:$pypath}
        fi
        if ! PYTHONPATH=$pypath python3 -c 'import pytest' >>"$log" 2>&1; then
            fail "dist: python3 has no pytest here (carry its wheels in .carry/wheels: pytest, pluggy, iniconfig, packaging, pygments)"
            return
        fi
    fi
    # The GPU cases: those named *gpus*; the four-GPU ones (*four_gpus*) where four GPUs answer.
    local select=(-k gpus)
    (($(gpu_count) < 4)) && select=(-k "gpus and not four_gpus")
    # shellcheck disable=SC2086  # extra words
    PYTHONPATH=$pypath LATHE_BIN=$lathe LATHE_BUILD_DIR=$bin timeout "$(limit 360)" \
        python3 -m pytest -q -rfEs -p no:cacheprovider "$tests" \
        ${GPU_CHECK_DIST_PYTEST_ARGS:-"${select[@]}"} >>"$log" 2>&1
    rc=$?
    echo "rc=$rc" >>"$log"
    local passed failed skipped errors found names
    read -r passed failed skipped errors found < <(pytest_counts "$log")
    if ((!found)); then
        local why="exit $rc"
        ((rc == 124)) && why="timed out"
        fail "$file: no summary ($why; last line: $(last_line "$log"))"
    elif ((rc == 0 && passed > 0 && failed == 0 && skipped == 0 && errors == 0)); then
        pass "$file $passed passed"
    else
        names=$(grep -E '^(FAILED|ERROR|SKIPPED) ' "$log" | cut -c1-120 | head -3 | tr '\n' ';')
        fail "$file: exit $rc, $passed passed, $failed failed, $skipped skipped, $errors errors${names:+ (${names%;})}"
    fi
}

for part in "${parts[@]}"; do
    case $part in
        doctor | tests | bench | resume | baseline | profile | curve | sanitize | opsbench | compare | scaling | dist)
            if ((SECONDS >= deadline)); then
                fail "$part: not run (the check's ${GPU_CHECK_BUDGET:-540} s were spent)"
            else
                "part_$part"
            fi
            ;;
        *) fail "unknown part '$part' (doctor tests bench resume baseline profile curve sanitize opsbench compare scaling dist)" ;;
    esac
done

echo "== logs"
for f in "$out"/*.txt; do
    [[ -e $f ]] || continue
    echo "-- $(basename "$f")"
    case $f in
        *_top.txt | opsbench.txt) cut -c1-160 "$f" ;;
        */scaling.txt) cat "$f" ;;
        *) grep -E "^rc=|PASSED|FAILED|SKIPPED|ready|tokens_per_s|\[gpu|\[fusion\]|gemm: cuBLASLt|gpt2_124M|llama_1B|resume:|validation" "$f" |
            cut -c1-400 | tail -40 ;;
    esac
done

# The verdict: every check's summary, failures first.
failed=() passed=()
for r in "${results[@]}"; do
    case $r in
        FAIL\|*) failed+=("${r#FAIL|}") ;;
        *) passed+=("${r#PASS|}") ;;
    esac
done
join() {
    local s="" x
    for x in "$@"; do s+="${s:+, }$x"; done
    echo "$s"
}
if ((${#failed[@]} == 0 && ${#passed[@]} > 0)); then
    verdict="gpu-check: PASS ($(join "${passed[@]}"))"
    status=0
else
    ((${#failed[@]})) || failed=("nothing was checked")
    verdict="gpu-check: FAIL ($(join "${failed[@]}"); passed: $(join "${passed[@]}"))"
    status=1
fi
echo "$verdict" >"$out/verdict.txt"
cp "$out/verdict.txt" "$final_out/verdict.txt"
tar czf "$final_out/gpu-check.tgz" -C "$out" .
rm -rf "$work"
echo "$verdict"
exit $status

"""scripts/gpu-check.sh's verdict, checked off the GPU machine.

The script's parts run the binaries of GPU_CHECK_BIN; here that folder holds shell stand-ins
(GoogleTest binaries that pass, fail, skip or crash; a `lathe` whose doctor and bench print what a
case needs), so every way the check must fail is shown to exit non-zero with one FAIL verdict
line naming the cause. The resume part runs the real lathe on the CPU (a smaller model), where it
must find the SIGKILLed-and-restarted run bit-identical to the uninterrupted one, and must fail
when the restarted run trains differently.
"""
import os
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
LATHE = os.environ.get("LATHE_BIN", str(ROOT / "build" / "lathe"))

GTEST_STUB = r"""#!/usr/bin/env bash
case ${STUB_%(var)s:-pass} in
  pass) printf '[==========] 3 tests from 1 test suite ran. (5 ms total)\n[  PASSED  ] 3 tests.\n' ;;
  fail) printf '[  FAILED  ] Suite.Broken (1 ms)\n[==========] 3 tests from 1 test suite ran. (5 ms total)\n'
        printf '[  PASSED  ] 2 tests.\n[  FAILED  ] 1 test, listed below:\n[  FAILED  ] Suite.Broken\n\n 1 FAILED TEST\n'
        exit 1 ;;
  skip) printf '[  SKIPPED ] Suite.Skipped (0 ms)\n[==========] 3 tests from 1 test suite ran. (5 ms total)\n'
        printf '[  PASSED  ] 2 tests.\n[  SKIPPED ] 1 test, listed below:\n[  SKIPPED ] Suite.Skipped\n' ;;
  crash) printf '[ RUN      ] Suite.Crashes\nSegmentation fault\n'; exit 139 ;;
  none) printf '[==========] 0 tests from 0 test suites ran. (0 ms total)\n[  PASSED  ] 0 tests.\n' ;;
esac
"""

# doctor and bench answer as the case asks; train/tokenizer/prepare go to the real lathe, and
# STUB_RESUME_LR changes the learning rate of every run that resumes from a checkpoint.
LATHE_STUB = r"""#!/usr/bin/env bash
case $1 in
  doctor)
    if [[ ${2:-} == --json ]]; then
      echo "{\"status\": \"${STUB_DOCTOR:-gpu_ready}\", \"verdict\": \"stub verdict\"}"
    else
      echo "stub doctor"
    fi ;;
  launch)
    # launch --gpus N -- PROGRAM ARGS: the program runs as the world's rank 0 (STUB_WORLD).
    # STUB_LAUNCH_FAIL=N fails --gpus N; STUB_LAUNCH_IGNORES=1 runs one process whatever N is.
    n=$3
    shift 4
    if [[ ${STUB_LAUNCH_FAIL:-} == "$n" ]]; then
      echo "lathe: error: stub launch: rank 1 exited with status 1" >&2; exit 1
    fi
    [[ ${STUB_LAUNCH_IGNORES:-} == 1 ]] && n=1
    STUB_WORLD=$n exec "$@" ;;
  bench)
    args="$*"
    if [[ -n ${STUB_BENCH_DROP:-} && $args == *"$STUB_BENCH_DROP"* ]]; then
      echo "lathe: error: stub bench fails here" >&2; exit 1
    fi
    echo "plan table on stderr" >&2
    if [[ -n ${STUB_WORLD:-} ]]; then
      # Under launch: N x 1000 tokens/s, times STUB_EFF (0.97) on more than one GPU.
      tps=$(python3 -c "print(1000.0 * $STUB_WORLD * (1 if $STUB_WORLD == 1 else ${STUB_EFF:-0.97}))")
      echo "{\"model\": \"stub\", \"world_size\": $STUB_WORLD, \"tokens_per_s\": $tps, \"mfu\": 0.5, \"comm_wait_ms\": 1.5, \"peak_memory_bytes\": 2147483648, \"plan_error\": ${STUB_SCALING_PLAN_ERROR:-0.01}}"
    elif [[ ${STUB_BENCH_NO_PLAN:-} == 1 ]]; then
      echo '{"model": "stub", "tokens_per_s": 1000.0}'
    else
      echo "{\"model\": \"stub\", \"tokens_per_s\": 1000.0, \"plan_error\": ${STUB_PLAN_ERROR:-0.004}}"
    fi ;;
  train)
    extra=()
    for ((i = 1; i <= $#; i++)); do
      if [[ ${!i} == --run-dir ]]; then j=$((i + 1)); run=${!j}; fi
    done
    if [[ -n ${STUB_RESUME_LR:-} && -d $run/checkpoints ]] && compgen -G "$run/checkpoints/step-*" >/dev/null; then
      extra=(--set "optimizer.lr=$STUB_RESUME_LR")
    fi
    # STUB_CORRUPT_FINAL: one byte of the reference run's final model.safetensors changes (the
    # reference is never killed, so it may run as a child; the killed run must be exec'd, or
    # SIGKILL would reach this script and leave lathe running).
    if [[ -n ${STUB_CORRUPT_FINAL:-} && $run == */reference ]]; then
      "$REAL_LATHE" "$@" || exit
      f=$(ls -d "$run"/checkpoints/step-* | sort | tail -1)/model.safetensors
      printf '\x7f' | dd of="$f" bs=1 seek=$(($(stat -c %s "$f") - 1)) conv=notrunc status=none
      exit 0
    fi
    exec "$REAL_LATHE" "$@" "${extra[@]}" ;;
  *) exec "$REAL_LATHE" "$@" ;;
esac
"""

# A model small enough for the CPU; the resume part's other settings stay as the GPU runs them.
SMALL = ("--set model.hidden_size=32 --set model.intermediate_size=64 --set model.num_hidden_layers=2 "
         "--set model.num_attention_heads=2 --set model.num_key_value_heads=1 "
         "--set data.seq_length=32 --set train.micro_batch_size=4 --set train.threads=2")


def write_exe(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture
def stub_bin(tmp_path):
    b = tmp_path / "bin"
    b.mkdir()
    for t in ("ops_gpu_tests", "model_gpu_tests", "align_gpu_tests", "dist_gpu_tests", "optim_gpu_tests",
              "infer_gpu_tests", "run_gpu_tests"):
        write_exe(b / t, GTEST_STUB % {"var": t.upper()})
    write_exe(b / "lathe", LATHE_STUB)
    return b


def check(stub_bin, tmp_path, *parts, **env):
    e = dict(os.environ, GPU_CHECK_BIN=str(stub_bin), REAL_LATHE=LATHE, GPU_CHECK_BUDGET="600")
    e.update({k: str(v) for k, v in env.items()})
    out = tmp_path / "out"
    p = subprocess.run(["bash", str(SCRIPT), str(out), *parts], capture_output=True, text=True,
                       env=e, timeout=600)
    lines = p.stdout.strip().splitlines()
    verdict = lines[-1] if lines else ""
    # One verdict line, also in OUT, with the logs archived beside it.
    assert verdict.startswith("gpu-check: "), p.stdout + p.stderr
    assert (out / "verdict.txt").read_text().strip() == verdict
    assert (out / "gpu-check.tgz").stat().st_size > 0
    return p.returncode, verdict, p.stdout


def test_all_passing_parts_pass(stub_bin, tmp_path):
    rc, verdict, _ = check(stub_bin, tmp_path, "doctor", "tests", "bench")
    assert rc == 0, verdict
    assert verdict == ("gpu-check: PASS (doctor gpu_ready, ops_gpu_tests 3/3, model_gpu_tests 3/3, "
                       "align_gpu_tests 3/3, dist_gpu_tests 3/3, optim_gpu_tests 3/3, infer_gpu_tests 3/3, run_gpu_tests 3/3, bench 8/8 rows, plan error +0.4..+0.4%)")


@pytest.mark.parametrize("env,needle", [
    ({"STUB_OPS_GPU_TESTS": "fail"}, "ops_gpu_tests 2/3 (exit 1, 1 failed, 0 skipped: Suite.Broken)"),
    ({"STUB_MODEL_GPU_TESTS": "skip"}, "model_gpu_tests 2/3 (exit 0, 0 failed, 1 skipped: Suite.Skipped)"),
    ({"STUB_ALIGN_GPU_TESTS": "crash"}, "align_gpu_tests: no summary (exit 139"),
    ({"STUB_ALIGN_GPU_TESTS": "none"}, "align_gpu_tests 0/0"),
    ({"STUB_DOCTOR": "not_ready"}, "doctor: exit 0, status 'not_ready'"),
    ({"STUB_BENCH_DROP": "--recompute full"}, "bench gpt2_full: no tokens_per_s"),
    ({"STUB_BENCH_NO_PLAN": "1"}, "bench gpt2: no plan_error"),
    ({"STUB_PLAN_ERROR": "0.051"}, "bench gpt2: the plan is off the measured peak by +5.1%"),
    ({"STUB_PLAN_ERROR": "-0.06"}, "bench llama: the plan is off the measured peak by -6.0%"),
])
def test_each_failure_fails_the_check(stub_bin, tmp_path, env, needle):
    rc, verdict, _ = check(stub_bin, tmp_path, "doctor", "tests", "bench", **env)
    assert rc == 1
    assert verdict.startswith("gpu-check: FAIL (")
    assert needle in verdict


def test_a_missing_binary_fails(stub_bin, tmp_path):
    (stub_bin / "model_gpu_tests").unlink()
    rc, verdict, _ = check(stub_bin, tmp_path, "tests")
    assert rc == 1
    assert "model_gpu_tests: binary missing" in verdict
    assert "ops_gpu_tests 3/3" in verdict  # the others still ran


def test_tests_part_runs_the_binaries_named(stub_bin, tmp_path):
    (stub_bin / "ops_gpu_tests").unlink()
    rc, verdict, _ = check(stub_bin, tmp_path, "tests", GPU_CHECK_TESTS="model_gpu_tests infer_gpu_tests")
    assert rc == 0, verdict
    assert verdict == "gpu-check: PASS (model_gpu_tests 3/3, infer_gpu_tests 3/3)"


def test_unknown_part_and_nothing_checked_fail(stub_bin, tmp_path):
    rc, verdict, _ = check(stub_bin, tmp_path, "tests", "benhc")
    assert rc == 1 and "unknown part 'benhc'" in verdict
    rc, verdict, _ = check(stub_bin, tmp_path, "tests", GPU_CHECK_BUDGET="0")
    assert rc == 1 and "tests: not run" in verdict


def test_no_bundle_fails(tmp_path):
    # Without GPU_CHECK_BIN the script unpacks .carry/gpu-bundle.tgz; point it at a tree without one.
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    for s in ("gpu-check.sh", "gpu-bundle.sh"):
        (tree / "scripts" / s).write_bytes((ROOT / "scripts" / s).read_bytes())
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_")}
    p = subprocess.run(["bash", str(tree / "scripts" / "gpu-check.sh"), str(tmp_path / "out"), "tests"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 1
    verdict = p.stdout.strip().splitlines()[-1]
    assert "bundle: .carry/gpu-bundle.tgz missing" in verdict
    assert "ops_gpu_tests: binary missing" in verdict




# compute-sanitizer and cuda_ops_bench stand-ins: STUB_MEMCHECK_ERRORS errors make memcheck exit
# with --error-exitcode; STUB_OPSBENCH=fail makes the bench exit 1.
SANITIZER_STUB = r"""#!/usr/bin/env bash
tool=$2
shift 2
if [[ $tool == memcheck ]]; then
  n=${STUB_MEMCHECK_ERRORS:-0}
  echo "========= ERROR SUMMARY: $n errors"
  ((n == 0)) || exit 9
else
  # Reports inside cuBLASLt's kernels are not lathe's; STUB_RACE_IN_LATHE adds one in a lathe kernel.
  echo "========= Error: Race reported between Read access at nvjet_sm90_tst_64x16_splitK_NNT+0xb30"
  [[ -n ${STUB_RACE_IN_LATHE:-} ]] && echo "========= Error: Race reported between Read access at lm_head_rows+0x10"
  echo "========= RACECHECK SUMMARY: 1 hazards displayed (1 errors, 0 warnings)"
fi
"""

OPSBENCH_STUB = r"""#!/usr/bin/env bash
[[ ${STUB_OPSBENCH:-pass} == pass ]] || { echo "cudaErrorNoDevice" >&2; exit 1; }
printf '| op | shape | us | floor us |\n|---|---|---|---|\n| gelu | 32x1024x3072 | 80.0 | 64.0 |\n'
"""


@pytest.fixture
def tools_path(tmp_path):
    tools = tmp_path / "tools"
    tools.mkdir()
    write_exe(tools / "compute-sanitizer", SANITIZER_STUB)
    return f"{tools}:{os.environ['PATH']}"


def test_sanitize_and_opsbench_pass(stub_bin, tmp_path, tools_path):
    write_exe(stub_bin / "cuda_ops_bench", OPSBENCH_STUB)
    rc, verdict, _ = check(stub_bin, tmp_path, "sanitize", "opsbench", PATH=tools_path)
    assert rc == 0, verdict
    assert verdict == "gpu-check: PASS (memcheck 0 errors, racecheck 0 hazards in lathe's kernels (1 reports inside cuBLASLt's nvjet), opsbench 1 ops)"


@pytest.mark.parametrize("env,needle", [
    ({"STUB_MEMCHECK_ERRORS": "2"}, "memcheck: exit 9, 2 error summary"),
    ({"STUB_OPSBENCH": "fail"}, "opsbench: exit 1"),
    ({"STUB_RACE_IN_LATHE": "1"}, "racecheck: 1 hazard reports in lathe's kernels (========= Error: Race reported between Read access at lm_head_rows"),
])
def test_sanitize_and_opsbench_failures_fail(stub_bin, tmp_path, tools_path, env, needle):
    write_exe(stub_bin / "cuda_ops_bench", OPSBENCH_STUB)
    rc, verdict, _ = check(stub_bin, tmp_path, "sanitize", "opsbench", PATH=tools_path, **env)
    assert rc == 1
    assert needle in verdict, verdict


def test_opsbench_without_its_binary_fails(stub_bin, tmp_path):
    rc, verdict, _ = check(stub_bin, tmp_path, "opsbench")
    assert rc == 1 and "cuda_ops_bench: binary missing" in verdict


def test_compare_reports_after_over_before(stub_bin, tmp_path):
    before = tmp_path / "before"
    before.mkdir()
    write_exe(before / "lathe", '#!/usr/bin/env bash\necho \'{"model": "stub", "tokens_per_s": 800.0}\'\n')
    rc, verdict, _ = check(stub_bin, tmp_path, "compare", GPU_CHECK_BEFORE_BIN=before)
    assert rc == 0, verdict
    assert verdict == ("gpu-check: PASS (compare after/before: gpt2 1.250x (before 800 800, after 1000 "
                       "1000 tok/s); llama 1.250x (before 800 800, after 1000 1000 tok/s))")
    write_exe(before / "lathe", "#!/usr/bin/env bash\necho 'lathe: error: no GPU' >&2; exit 1\n")
    rc, verdict, _ = check(stub_bin, tmp_path, "compare", GPU_CHECK_BEFORE_BIN=before)
    assert rc == 1 and "compare gpt2 before round 1: no tokens_per_s (lathe: error: no GPU)" in verdict, verdict


def test_resume_part_passes_on_an_exact_resume(stub_bin, tmp_path):
    rc, verdict, stdout = check(stub_bin, tmp_path, "resume", GPU_CHECK_DEVICE="cpu",
                                GPU_CHECK_RESUME_SETS=SMALL, GPU_CHECK_RESUME_STEPS=160,
                                GPU_CHECK_RESUME_EVERY=10)
    assert rc == 0, stdout
    assert verdict.startswith("gpu-check: PASS (resume exact on cpu (killed after step/checkpoint ")


def test_resume_part_fails_when_the_restart_trains_differently(stub_bin, tmp_path):
    rc, verdict, stdout = check(stub_bin, tmp_path, "resume", GPU_CHECK_DEVICE="cpu",
                                GPU_CHECK_RESUME_SETS=SMALL, GPU_CHECK_RESUME_STEPS=160,
                                GPU_CHECK_RESUME_EVERY=10, STUB_RESUME_LR="1.0e-3")
    assert rc == 1, stdout
    assert verdict.startswith("gpu-check: FAIL (resume: ")


def test_resume_part_fails_when_the_final_checkpoint_differs(stub_bin, tmp_path):
    rc, verdict, stdout = check(stub_bin, tmp_path, "resume", GPU_CHECK_DEVICE="cpu",
                                GPU_CHECK_RESUME_SETS=SMALL, GPU_CHECK_RESUME_STEPS=160,
                                GPU_CHECK_RESUME_EVERY=10, STUB_CORRUPT_FINAL="1")
    assert rc == 1, stdout
    assert "resume: step-00000160 differs from the uninterrupted run's in model.safetensors" in verdict



# The scaling and dist parts' machine: nvidia-smi -L lists STUB_GPUS GPUs (default 2); torchrun
# (GPU_CHECK_TORCHRUN) prints ddp_baseline.py's line, 900 tokens/s per GPU for DDP and 800 for
# FSDP2, or fails when "SCRIPT MODEL N" contains STUB_TORCH_FAIL.
NVIDIA_SMI_STUB = r"""#!/usr/bin/env bash
for ((i = 0; i < ${STUB_GPUS:-2}; i++)); do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i)"; done
"""

TORCHRUN_STUB = r"""#!/usr/bin/env bash
[[ $1 == --standalone && $2 == --nproc_per_node ]] || { echo "stub torchrun: bad arguments $*" >&2; exit 2; }
n=$3 script=$4 model=$5
[[ -f $script ]] || { echo "stub torchrun: no $script" >&2; exit 2; }
who=ddp per=900
[[ $script == *fsdp2_baseline.py ]] && who=fsdp2 per=800
if [[ -n ${STUB_TORCH_FAIL:-} && "$who $model $n" == *"$STUB_TORCH_FAIL"* ]]; then
  echo "torch.distributed.DistBackendError: NCCL error" >&2; exit 1
fi
echo "{\"what\": \"$who+compile $model\", \"world\": $n, \"tok_s_per_gpu\": $per, \"tok_s_total\": $((per * n)), \"step_ms\": 10.0, \"mem_GiB\": 3.0}"
"""


@pytest.fixture
def multi(stub_bin, tmp_path):
    """PATH with nvidia-smi, and the environment of the scaling part's stand-ins."""
    tools = tmp_path / "multi-tools"
    tools.mkdir()
    write_exe(tools / "nvidia-smi", NVIDIA_SMI_STUB)
    write_exe(tools / "torchrun", TORCHRUN_STUB)
    torch_bench = tmp_path / "torch-bench"
    torch_bench.mkdir()
    for f in ("ddp_baseline.py", "torch_baseline.py"):
        (torch_bench / f).write_text("# stand-in\n")
    return {"PATH": f"{tools}:{os.environ['PATH']}", "GPU_CHECK_TORCHRUN": str(tools / "torchrun"),
            "GPU_CHECK_TORCH_BENCH": str(torch_bench)}


def test_scaling_on_two_gpus_reports_the_table(stub_bin, tmp_path, multi):
    rc, verdict, stdout = check(stub_bin, tmp_path, "scaling", **multi)
    assert rc == 0, stdout
    # 1000 tokens/s on one GPU, 1940 on two: 97.0%; DDP 900 and 1800, FSDP2 800 and 1600.
    assert verdict == ("gpu-check: PASS (scaling 14/14 rows: gpt2 zero 1 efficiency 2:97.0%, lathe/DDP "
                       "1:1.11 2:1.08, lathe/FSDP2 1:1.25 2:1.21; llama zero 1 efficiency 2:97.0%, "
                       "lathe/DDP 1:1.11 2:1.08, lathe/FSDP2 1:1.25 2:1.21; speed goals met)")
    table = (tmp_path / "out" / "scaling.txt").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| gpt2") or line.startswith("| llama")]
    assert len(rows) == 14
    assert "| gpt2 | lathe zero 1 | 2 | 1940 | 970 | 97.0% | 1.078 | 1.212 | 0.500 | 1.5 | 2.0 |" in rows
    assert "| gpt2 | lathe zero 0 | 1 | 1000 | 1000 | 100.0% | 1.111 | 1.250 | 0.500 | 1.5 | 2.0 |" in rows
    assert "| llama | fsdp2 | 2 | 1600 | 800 | 100.0% | - | - | - | - | 3.0 |" in rows
    assert table in stdout  # the table is in the call's output too


def test_scaling_on_four_gpus_one_model(stub_bin, tmp_path, multi):
    rc, verdict, stdout = check(stub_bin, tmp_path, "scaling", STUB_GPUS=4, GPU_CHECK_SCALING_MODELS="gpt2",
                                STUB_EFF="0.9", **multi)
    # A missed speed goal is reported, not failed.
    assert rc == 0, stdout
    assert verdict.startswith("gpu-check: PASS (scaling 12/12 rows: gpt2 zero 1 efficiency 2:90.0% 4:90.0%, ")
    assert verdict.endswith("; 2 speed goals missed)")
    table = (tmp_path / "out" / "scaling.txt").read_text()
    assert "speed goals missed: gpt2 zero 1 efficiency 90.0% at N=2 (goal 95%); gpt2 zero 1 efficiency 90.0% at N=4" in table


@pytest.mark.parametrize("env,needle", [
    ({"STUB_TORCH_FAIL": "fsdp2 llama1b 2"},
     "scaling 13/14 rows: llama fsdp2 N=2: no result (exit 1: torch.distributed.DistBackendError: NCCL error)"),
    ({"STUB_LAUNCH_FAIL": "2"}, "scaling 11/14 rows: gpt2 lathe zero1 N=2: no result (exit 1: lathe: error: stub "
                                "launch: rank 1 exited with status 1); gpt2 lathe zero0 N=2"),
    ({"STUB_LAUNCH_IGNORES": "1"}, "gpt2 lathe zero1 N=2: its line says world size 1, not 2"),
    ({"STUB_BENCH_DROP": "--zero-stage 0"}, "scaling 12/14 rows: gpt2 lathe zero0 N=1: no result (exit 1: lathe: error: stub bench fails here)"),
    ({"STUB_SCALING_PLAN_ERROR": "0.08"},
     "gpt2 lathe zero1 N=1: memory plan +8.0% off the measured peak (limit 5%)"),
    ({"STUB_GPUS": "0"}, "scaling: nvidia-smi -L lists 0 GPUs, none of N = 1 2 4"),
    ({"GPU_CHECK_SCALING_MODELS": "gpt3"}, "scaling: unknown model 'gpt3'"),
])
def test_scaling_failures_fail(stub_bin, tmp_path, multi, env, needle):
    rc, verdict, stdout = check(stub_bin, tmp_path, "scaling", **{**multi, **env})
    assert rc == 1, stdout
    assert needle in verdict, verdict


def test_scaling_without_the_torch_scripts_fails_and_still_runs_lathe(stub_bin, tmp_path, multi):
    (tmp_path / "torch-bench" / "ddp_baseline.py").unlink()
    rc, verdict, _ = check(stub_bin, tmp_path, "scaling", GPU_CHECK_SCALING_MODELS="llama", **multi)
    assert rc == 1
    assert "ddp_baseline.py,torch_baseline.py} missing" in verdict
    assert "scaling 2/2 rows: llama zero 1 efficiency 2:97.0%, lathe/DDP -, lathe/FSDP2 -" in verdict


def test_scaling_rows_past_the_budget_are_missing(stub_bin, tmp_path, multi):
    # The lathe stand-in sleeps 5 s; a budget of 4 s stops the first run and leaves the rest unrun.
    write_exe(stub_bin / "lathe", LATHE_STUB.replace("  launch)\n", "  launch)\n    sleep 5\n"))
    rc, verdict, _ = check(stub_bin, tmp_path, "scaling", GPU_CHECK_SCALING_MODELS="llama",
                           GPU_CHECK_BUDGET="4", **multi)
    assert rc == 1
    assert ("scaling 0/6 rows: llama lathe zero1 N=1: no result (exit 124, timed out); llama ddp N=1: "
            "no result (not run: the check's time was spent); llama fsdp2 N=1: no result (not run: "
            "the check's time was spent) (and 3 more)") in verdict, verdict


# The GPU cases (named test_gpus_*) are what the part selects; the CPU case fails if run.
DIST_TESTS = """
import os, pytest

def test_gpus_lathe_is_given():
    assert os.path.basename(os.environ["LATHE_BIN"]) == "lathe"

def test_gpus_outcome():
    what = os.environ.get("STUB_DIST", "pass")
    if what == "skip":
        pytest.skip("needs 2 GPUs")
    assert what == "pass"

def test_cpu_ranks_under_mpirun():
    assert False, "a CPU case ran on the GPU machine"
"""


@pytest.fixture
def dist_env(stub_bin, tmp_path, multi):
    write_exe(stub_bin / "dist_two_gpu_tests", GTEST_STUB % {"var": "DIST_TWO_GPU_TESTS"})
    write_exe(stub_bin / "infer_two_gpu_tests", GTEST_STUB % {"var": "INFER_TWO_GPU_TESTS"})
    tests = tmp_path / "dist" / "test_dp_stub.py"
    tests.parent.mkdir()
    tests.write_text(DIST_TESTS)
    return {**multi, "GPU_CHECK_DIST_TESTS": str(tests)}


def test_dist_part_passes(stub_bin, tmp_path, dist_env):
    rc, verdict, stdout = check(stub_bin, tmp_path, "dist", **dist_env)
    assert rc == 0, stdout
    assert verdict == ("gpu-check: PASS (dist_two_gpu_tests 3/3, infer_two_gpu_tests 3/3, "
                       "test_dp_stub.py 2 passed)")


@pytest.mark.parametrize("env,needle", [
    ({"STUB_DIST": "skip"}, "test_dp_stub.py: exit 0, 1 passed, 0 failed, 1 skipped, 0 errors (SKIPPED [1] "),
    ({"STUB_DIST": "fail"}, "test_dp_stub.py: exit 1, 1 passed, 1 failed, 0 skipped, 0 errors (FAILED "),
    ({"STUB_DIST_TWO_GPU_TESTS": "fail"}, "dist_two_gpu_tests 2/3 (exit 1, 1 failed"),
    ({"STUB_DIST_TWO_GPU_TESTS": "skip"}, "dist_two_gpu_tests 2/3 (exit 0, 0 failed, 1 skipped"),
    ({"STUB_INFER_TWO_GPU_TESTS": "fail"}, "infer_two_gpu_tests 2/3 (exit 1, 1 failed"),
    ({"STUB_GPUS": "1"}, "dist: needs 2 GPUs or more, nvidia-smi -L lists 1"),
    ({"GPU_CHECK_DIST_TESTS": "/nonexistent/test_x.py"}, "dist: /nonexistent/test_x.py missing"),
    ({"GPU_CHECK_DIST_PYTEST_ARGS": "-k nothing_matches"}, "test_dp_stub.py: exit 5, 0 passed, 0 failed, 0 skipped"),
    ({"GPU_CHECK_DIST_PYTEST_ARGS": "-k cpu"}, "test_dp_stub.py: exit 1, 0 passed, 1 failed"),
])
def test_dist_part_failures_fail(stub_bin, tmp_path, dist_env, env, needle):
    rc, verdict, stdout = check(stub_bin, tmp_path, "dist", **{**dist_env, **env})
    assert rc == 1, stdout
    assert needle in verdict, verdict


def test_dist_part_without_its_binary_fails(stub_bin, tmp_path, dist_env):
    (stub_bin / "dist_two_gpu_tests").unlink()
    rc, verdict, _ = check(stub_bin, tmp_path, "dist", **dist_env)
    assert rc == 1
    assert "dist_two_gpu_tests: binary missing" in verdict and "test_dp_stub.py 2 passed" in verdict


def test_dist_part_installs_the_carried_corpus_where_it_is_missing(stub_bin, tmp_path, dist_env):
    dictd = tmp_path / "dictd"
    rc, verdict, stdout = check(stub_bin, tmp_path, "dist", GPU_CHECK_DICTD=dictd, **dist_env)
    if (ROOT / ".carry" / "dictd" / "gcide.dict.dz").is_file():
        assert rc == 0, stdout
        assert (dictd / "gcide.dict.dz").read_bytes() == (ROOT / ".carry" / "dictd" / "gcide.dict.dz").read_bytes()
    else:
        assert rc == 1
        assert f"dist: the tests' corpus {dictd}/gcide.dict.dz is missing here (carry .carry/dictd/gcide.dict.dz)" in verdict

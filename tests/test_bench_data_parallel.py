"""`lathe bench` under a launcher, on the CPU: `mpirun -np 2 lathe bench ...` trains the tiny
model data parallel (the trainer's DataParallel and TrainStep) and prints one JSON line, from
rank 0, with the world's numbers (run/bench.h):

  - exactly one line on stdout; world_size 2, the launcher, the ZeRO stage; tokens_per_s is the
    world's and tokens_per_s_per_gpu its half; comm_wait_ms measured; the plan is one rank's
    (ZeRO-1 holds half the optimizer state ZeRO-0 holds) and printed once, by rank 0;
  - ZeRO-0 and ZeRO-1 give the same loss and norm bits (the same reductions, an elementwise
    AdamW);
  - one process adds only world_size 1 to its line;
  - a stage DataParallel does not run, and one outside 0..3, are errors naming --zero-stage,
    on every rank (no hang).
"""
import json
import os
import shutil
import subprocess

import pytest

LATHE = os.environ.get("LATHE_BIN", "build/lathe")
MPIRUN = shutil.which("mpirun")
needs_mpirun = pytest.mark.skipif(
    MPIRUN is None, reason="needs mpirun (OpenMPI; scripts/install-deps.sh installs it)")

TINY = ["--model", "tiny", "--batch", "2", "--seq", "16", "--steps", "3", "--warmup", "1",
        "--device", "cpu", "--threads", "1"]

# The keys of a one-process line, in order (run/bench.h); several ranks add those of MULTI_KEYS.
SINGLE_KEYS = ["model", "device", "device_name", "batch", "seq", "params", "flop_params",
               "flops_per_token", "plan_bytes", "recompute", "precision", "steps", "warmup", "tokens_per_s",
               "step_ms_median", "step_ms_mean", "step_ms_min", "step_ms_max", "peak_flops", "mfu",
               "peak_memory_bytes", "peak_memory_source", "loss_first", "loss_last",
               "grad_norm_last", "seed", "deterministic", "requested_device", "world_size"]
MULTI_KEYS = ["launcher", "zero_stage", "tokens_per_s_per_gpu", "comm_wait_ms", "plan"]


def env():
    return dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
                OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def ranks(n, *args, check=True):
    p = subprocess.run([MPIRUN, "--oversubscribe", "-np", str(n), LATHE, "bench", *map(str, args)],
                       capture_output=True, text=True, timeout=180, env=env())
    if check:
        assert p.returncode == 0, f"mpirun -np {n} lathe bench failed ({p.returncode}):\n{p.stderr}"
    return p


def one_line(p):
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1, f"stdout must be one JSON line (rank 0's), got:\n{p.stdout}"
    return json.loads(lines[0])


@needs_mpirun
def test_two_ranks_print_one_line_of_the_world():
    p = ranks(2, *TINY)
    r = one_line(p)
    assert list(r) == SINGLE_KEYS + MULTI_KEYS
    assert (r["world_size"], r["launcher"], r["zero_stage"]) == (2, "mpirun", 1)
    assert (r["batch"], r["seq"], r["steps"]) == (2, 16, 3)  # B per rank
    # The world's rate: the sum over the ranks, so twice the per-GPU figure.
    assert r["tokens_per_s"] == pytest.approx(2 * r["tokens_per_s_per_gpu"], rel=1e-12)
    assert r["tokens_per_s_per_gpu"] > 0 and r["mfu"] is None
    # The CPU's wait is the time inside the collectives: there is some every step.
    assert 0 < r["comm_wait_ms"] < 1000
    assert r["peak_memory_source"] == "max_rss" and r["peak_memory_bytes"] >= r["plan_bytes"]
    plan = r["plan"]
    assert r["plan_bytes"] == sum(plan[k] for k in ("parameters", "gradients", "optimizer",
                                                    "activations", "scratch", "runtime"))
    # Rank 0 alone prints the plan table and its progress.
    assert p.stderr.count("memory plan:") == 1 and "per rank of 2 (ZeRO-1)" in p.stderr
    assert p.stderr.count("timed step 3/3") == 1


@needs_mpirun
def test_zero_stages_give_the_same_bits():
    z1 = one_line(ranks(2, *TINY, "--zero-stage", 1))
    z0 = one_line(ranks(2, *TINY, "--zero-stage", 0))
    assert z0["zero_stage"] == 0
    for key in ("loss_first", "loss_last", "grad_norm_last"):
        assert z0[key] == z1[key], key
    # ZeRO-1 keeps AdamW's two moments for its half of the (padded) parameters only.
    assert z1["plan"]["optimizer"] == pytest.approx(z0["plan"]["optimizer"] / 2, rel=0.01)
    assert z1["plan"]["optimizer"] < z0["plan"]["optimizer"]


def test_one_process_adds_only_the_world_size():
    p = subprocess.run([LATHE, "bench", *TINY], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    r = one_line(p)
    assert list(r) == SINGLE_KEYS
    assert r["world_size"] == 1
    assert "data parallel" not in p.stderr


def test_a_stage_outside_the_range_is_an_error():
    p = subprocess.run([LATHE, "bench", *TINY, "--zero-stage", "5"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "--zero-stage must be 0, 1, 2 or 3, got 5" in p.stderr, p.stderr


@needs_mpirun
def test_a_stage_data_parallel_does_not_run_stops_every_rank():
    p = ranks(2, *TINY, "--zero-stage", 3, check=False)
    assert p.returncode != 0 and p.stdout == ""
    assert p.stderr.count("lathe: error: --zero-stage: parallel.zero_stage 3") == 2, p.stderr

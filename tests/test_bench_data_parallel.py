"""`lathe bench` under a launcher, on the CPU: `mpirun -np 2 lathe bench ...` trains the tiny
model data parallel (the trainer's DataParallel and TrainStep) and prints one JSON line, from
rank 0, with the world's numbers (run/bench.h):

  - exactly one line on stdout; world_size 2, the launcher, the ZeRO stage; tokens_per_s is the
    world's and tokens_per_s_per_gpu its half; comm_wait_ms measured; the plan is one rank's
    (ZeRO-1 holds half the optimizer state ZeRO-0 holds) and printed once, by rank 0;
  - ZeRO-0 and ZeRO-1 give the same loss and norm bits (the same reductions, an elementwise
    AdamW);
  - one process adds only world_size 1 to its line;
  - ZeRO-2 and ZeRO-3 give ZeRO-1's bits too, ZeRO-3 planning each rank's parameter shard and
    gathered unit windows instead of the whole parameters;
  - a stage outside 0..3 is an error naming --zero-stage.
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
SINGLE_KEYS = ["model", "device", "device_name", "batch", "seq", "accum", "params", "flop_params",
               "flops_per_token", "plan_bytes", "lm_head_rows", "recompute", "precision", "optimizer_schedule",
               "optimizer_sms",
               "state_dtype", "steps", "warmup", "tokens_per_s",
               "step_ms_median", "s_per_it", "step_ms_mean", "step_ms_min", "step_ms_max", "peak_flops", "mfu",
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
def test_the_overlapped_optimizer_schedule_is_refused_for_several_ranks():
    p = ranks(2, *TINY, "--optimizer-schedule", "overlapped", check=False)
    assert p.returncode != 0
    assert "a world of 2 ranks keeps the serial schedule" in p.stderr, p.stderr


@needs_mpirun
def test_zero_2_and_3_give_the_bits_of_zero_1_and_3_shards_the_parameters():
    z1 = one_line(ranks(2, *TINY, "--zero-stage", 1))
    z2 = one_line(ranks(2, *TINY, "--zero-stage", 2))
    p3 = ranks(2, *TINY, "--zero-stage", 3)
    z3 = one_line(p3)
    assert (z2["zero_stage"], z3["zero_stage"]) == (2, 3)
    for key in ("loss_first", "loss_last", "grad_norm_last"):
        assert z1[key] == z2[key] == z3[key], key
    # ZeRO-3: half the (padded) parameters plus the gathered windows (the front, the back and two
    # layer windows: the tiny model's 2 layers, so not less than the whole here), the gradients
    # and optimizer state of ZeRO-2.
    assert z3["plan"]["gradients"] == z2["plan"]["gradients"]
    assert z3["plan"]["optimizer"] == z2["plan"]["optimizer"]
    assert "per rank of 2 (ZeRO-3)" in p3.stderr
    assert "parameters sharded over 2 ranks: shard" in p3.stderr, p3.stderr
    assert 0 < z3["comm_wait_ms"] < 1000


def test_accumulation_runs_k_micro_batches_a_step():
    """--accum K: a step is K micro-batches of B sequences. The bench's rows are drawn one after
    another, so K = 2 micro-batches of 1 sequence see the tokens of one micro-batch of 2: the first
    step's loss and gradient norm agree up to fp32 rounding (the mean of two means against one
    mean of the same 2 T tokens, and the gradients summed in another order: a few ulps, so a
    relative 1e-5), and tokens_per_s counts K B T tokens a step."""
    def bench(*extra):
        p = subprocess.run([LATHE, "bench", "--preset", "tiny", "--seq", "16", "--steps", "1",
                            "--warmup", "0", "--device", "cpu", "--threads", "1", *extra],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)
    one = bench("--batch", "2")
    two = bench("--batch", "1", "--accum", "2")
    assert (one["accum"], two["accum"]) == (1, 2)
    assert two["loss_first"] == pytest.approx(one["loss_first"], rel=1e-5)
    assert two["grad_norm_last"] == pytest.approx(one["grad_norm_last"], rel=1e-5)
    assert two["loss_first"] != bench("--batch", "1")["loss_first"]  # the second micro-batch counts
    assert two["s_per_it"] == pytest.approx(two["step_ms_median"] / 1e3, rel=1e-12)
    assert two["tokens_per_s"] == pytest.approx(2 * 16 / two["s_per_it"], rel=1e-12)
    p = subprocess.run([LATHE, "bench", "--preset", "tiny", "--batch", "1", "--seq", "16",
                        "--accum", "0", "--device", "cpu"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "--accum must be >= 1, got 0" in p.stderr, p.stderr

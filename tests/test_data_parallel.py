"""Data-parallel `lathe train`: several processes (ranks) training one model.

On the CPU the ranks run under `mpirun --oversubscribe -np N` (MPI collectives); this is the part CI
runs. The contract checked here:
  - N ranks of micro-batch b and accumulation a log the losses of one process of micro-batch b and
    accumulation N*a (each rank reads its slice of every global batch, GPT-NeoX's order): the same
    steps, learning rates and token counts, losses and gradient norms within 1e-5 relative (the
    cross-rank f32 sums add the same terms in another order than one process does: a random walk
    of about sqrt(K) 2^-24 of the terms' scale, under 1e-6 here, so 1e-5 is ten times that and
    still far under any real difference of data or arithmetic; over a few hundred steps the
    difference compounds through the updates: LONG_RUN_RTOL below);
  - ZeRO 0, 1, 2 and 3 give the same bits at the same N, with and without accumulation (every
    stage reduces every micro-batch into the same buffer values with the same collective, an
    elementwise AdamW; ZeRO-3 computes from gathered copies of the same weights), and the same
    command twice gives the same bits; ZeRO-3's checkpoint holds the model file of ZeRO 0's;
  - ZeRO-2's memory plan shows its gradients as the rank's shard plus unit windows, less than the
    whole model's, and ZeRO-3's its parameters as the rank's shard plus gathered unit windows;
  - rank 0 alone writes metrics.jsonl, config.yaml and the model files; with ZeRO-1 each rank
    writes its own optimizer shard, optimizer.rank-RRRRR-of-WWWWW.safetensors;
  - SIGKILL of any rank ends the job, and the same command resumes exactly (metrics.jsonl and the
    checkpoint files as those of a run never stopped); a checkpoint written by N ranks resumes at
    M ranks (accumulation scaled so that ranks x accumulation stays) with the same losses, 1e-5,
    and at another ZeRO stage (3 included, both ways) with the same bits;
  - ranks whose configurations differ, unknown ZeRO stages and a rank that stops answering are
    refused or stopped with a message naming the key or the wait.
On two or more GPUs (skipped otherwise) `lathe launch --gpus 2` runs the same comparisons on cuda:
losses within a bf16 tolerance derived below, ZeRO 0/1/2/3 identical bits, and a bit-exact resume.
"""
import filecmp
import importlib.util
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import NEEDS_CUDA
from corpus import write_gcide_jsonl
from lathe_cli import LATHE, TINY_MODEL, run, tokenize_corpus, wait_for_step

ROOT = Path(__file__).resolve().parent.parent
MPIRUN = shutil.which("mpirun")
needs_mpirun = pytest.mark.skipif(
    MPIRUN is None, reason="needs mpirun (OpenMPI; scripts/install-deps.sh installs it)")

# The CPU runs: a one-layer Llama of hidden size 32 (lathe_cli.TINY_MODEL) with a validation split,
# 8 steps of micro-batch 2, every step logged, checkpoints at steps 4 and 8.
SPLIT = 'split: "100,0,0"'
assert SPLIT in TINY_MODEL
TINY = TINY_MODEL.replace(SPLIT, 'split: "90,10,0"') + """
train:
  steps: 8
  micro_batch_size: 2
  gradient_accumulation_steps: 1
  log_interval: 1
  eval_interval: 4
  eval_iters: 2
  threads: 1
  device: cpu
optimizer:
  lr: 3.0e-3
lr:
  warmup: 0.1
checkpoint:
  interval: 4
  keep_last: 0
"""

# Cross-rank f32 sums against one process's: see the module docstring.
CPU_RTOL = 1e-5
# The same over a run of a few hundred steps (two epochs): the sum-order difference of each step
# compounds through AdamW's updates, and the gradient norm, a sum of squares over every weight,
# moves with it. Measured over the 72 logged steps of that run (361 steps): losses within 4e-6
# relative, gradient norms within 1.5e-4 (no difference at all before step 30, under 1e-6 to step
# 70; 1e-5 by step 80). A sample read out of order moves a loss by percents: 1e-4 for the loss and
# 1e-3 for the gradient norm are about 25 and 7 times the spread seen and still far under any such
# difference.
LONG_RUN_RTOL = 1e-4
LONG_RUN_GRAD_NORM_RTOL = 1e-3


def mpi_env(**extra):
    """The environment of an mpirun job here: one thread per rank (2 cores), and OpenMPI's consent
    to run as root (containers); NCCL's NVLink SHARP off for the GPU runs."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", NCCL_NVLS_ENABLE="0")
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("dp_corpus")
    write_gcide_jsonl(d / "c.jsonl", 200_000)
    tokenize_corpus(d / "c.jsonl", d / "tok.json", d / "gc", 300)
    (d / "tiny.yaml").write_text(TINY + f"\ndata.path: {d / 'gc'}\ndata.tokenizer: {d / 'tok.json'}\n")
    return d


def train_args(config, run_dir, *sets, program=LATHE):
    args = [program, "train", config, "--run-dir", run_dir]
    for s in sets:
        args += ["--set", s]
    return [str(a) for a in args]


def mpirun_args(n, args):
    return [MPIRUN, "--oversubscribe", "-np", str(n)] + args


def run_ranks(n, args, check=True, timeout=300):
    """`mpirun -np n ARGS` to completion; with check, a non-zero exit fails naming its stderr."""
    p = subprocess.run(mpirun_args(n, args), capture_output=True, text=True, timeout=timeout,
                       env=mpi_env())
    if check and p.returncode != 0:
        raise AssertionError(f"mpirun -np {n} {' '.join(args)} failed ({p.returncode}):\n"
                             f"{p.stdout}\n{p.stderr}")
    return p


def train(corpus, run_dir, n, accumulation, *sets):
    """The tiny run at n ranks (n = 1: one plain process, no mpirun) and this accumulation."""
    args = train_args(corpus / "tiny.yaml", run_dir,
                      f"train.gradient_accumulation_steps={accumulation}", *sets)
    if n == 1:
        return run(args[1:], env=mpi_env())
    return run_ranks(n, args)


def metric_lines(run_dir, world_size=False):
    """metrics.jsonl's lines without their timings and memory; without world_size unless asked (a
    one-process run's lines have none)."""
    out = []
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        j = json.loads(line)
        for timing in ("tokens_per_s", "comm_wait_ms", "mfu", "memory_bytes"):
            j.pop(timing, None)
        if not world_size:
            j.pop("world_size", None)
        out.append(j)
    return out


def world_sizes(run_dir):
    """The world_size of each train line."""
    return [m.get("world_size", 1) for m in metric_lines(run_dir, True) if m["split"] == "train"]


def assert_metrics_close(got, want, rtol, what, grad_norm_rtol=None):
    """The same lines (steps, splits, keys, learning rates and token counts exactly), every float
    result (loss, grad_norm) within rtol relative (grad_norm within grad_norm_rtol when given) and
    perplexity = exp(loss) within the loss's absolute tolerance, rtol loss, relative; returns the
    largest relative difference."""
    assert [(m["step"], m["split"]) for m in got] == [(m["step"], m["split"]) for m in want], what
    worst = 0.0
    for g, w in zip(got, want):
        assert sorted(g) == sorted(w), (what, g, w)
        for k in w:
            if k in ("loss", "grad_norm", "perplexity"):
                diff = abs(g[k] - w[k]) / abs(w[k])
                tol = rtol * abs(w["loss"]) if k == "perplexity" else rtol
                if k == "grad_norm" and grad_norm_rtol is not None:
                    tol = grad_norm_rtol
                worst = max(worst, diff)
                assert diff <= tol, f"{what}: step {w['step']} {w['split']} {k}: {g[k]} vs {w[k]} " \
                                     f"(relative {diff:.3g} > {tol:.3g})"
            else:
                assert g[k] == w[k], (what, k, g, w)
    return worst


def files_under(d):
    """The relative paths of every file under d, sorted; a TensorBoard events file as
    tb/events.out.tfevents.* (its name holds the time, host and pid of its writer)."""
    d = Path(d)
    return sorted(re.sub(r"^tb/events\.out\.tfevents\..*", "tb/events.out.tfevents.*",
                         str(p.relative_to(d))) for p in d.rglob("*") if p.is_file())


def assert_same_files(a, b):
    """The folders a and b hold the same files with the same bytes."""
    names = files_under(a)
    assert names == files_under(b), (a, b)
    for name in names:
        assert filecmp.cmp(Path(a) / name, Path(b) / name, shallow=False), name


def shard_names(world):
    return [f"optimizer.rank-{r:05d}-of-{world:05d}.safetensors" for r in range(world)]


def optimizer_files(checkpoint):
    return sorted(p.name for p in Path(checkpoint).iterdir() if p.name.startswith("optimizer"))


def canonical_moments(checkpoint):
    """{"exp_avg": ..., "exp_avg_sq": ...}: the optimizer state of a checkpoint folder as one
    canonical vector, from its full file or its range-list shard set (each file's metadata "ranges"
    lists the canonical ranges its moments hold, concatenated; the files tile [0, used))."""
    from safetensors import safe_open
    from safetensors.numpy import load_file
    checkpoint = Path(checkpoint)
    if (checkpoint / "optimizer.safetensors").exists():
        return load_file(str(checkpoint / "optimizer.safetensors"))
    out, seen = None, None
    for name in optimizer_files(checkpoint):
        with safe_open(str(checkpoint / name), "np") as f:
            meta = f.metadata()
            assert meta["format"] == "lathe-adamw-ranges", (name, meta)
            used = int(meta["used"])
            if out is None:
                out = {k: np.zeros(used, np.float32) for k in ("exp_avg", "exp_avg_sq")}
                seen = np.zeros(used, np.int32)
            ranges = [tuple(map(int, r.split("-"))) for r in meta["ranges"].split(",") if r]
            for k in out:
                t, at = f.get_tensor(k), 0
                for b, e in ranges:
                    out[k][b:e] = t[at:at + e - b]
                    at += e - b
                assert at == len(t), (name, k)
            for b, e in ranges:
                seen[b:e] += 1
    assert out is not None and (seen == 1).all(), checkpoint
    return out


def steps_of(run_dir):
    return sorted(p.name for p in (Path(run_dir) / "checkpoints").iterdir()
                  if p.name.startswith("step-"))


# ---- processes of a running job, by rank ----------------------------------------------------

def _children():
    """{pid: [child pids]} of every process on the machine."""
    kids = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kids.setdefault(int(fields[1]), []).append(int(p.name))
    return kids


def rank_pids(root_pid):
    """{rank: pid} of the lathe processes under root_pid (mpirun or `lathe launch`), each rank read
    from the launcher's variable in the process's environment."""
    kids, out, todo = _children(), {}, [root_pid]
    while todo:
        pid = todo.pop()
        todo += kids.get(pid, [])
        if pid == root_pid:
            continue
        try:
            env = dict(kv.split("=", 1) for kv in
                       Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
                       if "=" in kv)
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        rank = env.get("OMPI_COMM_WORLD_RANK", env.get("RANK"))
        if rank is not None and Path(exe).name == "lathe":
            out[int(rank)] = pid
    return out


def kill_rank_mid_run(args, run_dir, rank, at_step, world, env):
    """Starts ARGS (a launcher command), SIGKILLs `rank`'s process once metrics.jsonl shows
    at_step, and checks that the launcher then ends the whole job, non-zero, in bounded time."""
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_for_step(run_dir, at_step, p)
        pids = rank_pids(p.pid)
        assert sorted(pids) == list(range(world)), pids
        os.kill(pids[rank], signal.SIGKILL)
        _, err = p.communicate(timeout=120)
    finally:
        stop_job(p)
    assert p.returncode != 0, err
    deadline = time.time() + 30  # no rank outlives the job by long
    while any(alive(pid) for pid in pids.values()) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids.values()), (pids, err)
    return err


def stop_job(p):
    """SIGKILL to a launcher still running and to its ranks (a test that failed midway)."""
    if p.poll() is None:
        for pid in rank_pids(p.pid).values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.kill()
        p.wait()


def alive(pid):
    """Whether pid runs (a zombie, dead but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# ---- CPU: N ranks under mpirun ---------------------------------------------------------------

# The CPU runs the tests compare: name -> (ranks, accumulation, parallel.zero_stage or None, and
# optionally more --set values). "_l6": six layers, so that ZeRO-2's layer window is reused within
# each backward and its shard and windows (one layer window on the CPU) hold less than the whole
# model's gradients.
SIX_LAYERS = "model.num_hidden_layers=6"
# Frozen groups: the tied embedding (the front unit) and half of layer 0 (parts of every rank's
# chunk of its unit), zeroed in the shard at ZeRO-2.
FROZEN = "train.freeze=[model.embed_tokens.*, model.layers.0.mlp.*]"
# The device optimizer's moments in bf16 (ops/adamw.h), each rank over its ranges.
BF16_MOMENTS = "optimizer.state_dtype=bf16"
RUNS = {"one_a4": (1, 4, None), "one_a2": (1, 2, None), "one_a6": (1, 6, None),
        "n2_a2_z1": (2, 2, 1), "n2_a2_z1_again": (2, 2, 1), "n2_a2_z0": (2, 2, 0),
        "n4_a1_z1": (4, 1, 1), "n2_a1_z1": (2, 1, 1), "n3_a2_z1": (3, 2, 1),
        "n3_a1_z0": (3, 1, 0), "n3_a1_z1": (3, 1, 1),
        "n2_a1_z2": (2, 1, 2), "n2_a2_z2": (2, 2, 2), "n2_a2_z2_again": (2, 2, 2),
        "n3_a1_z2": (3, 1, 2), "n3_a2_z2": (3, 2, 2),
        "n2_a2_z1_l6": (2, 2, 1, SIX_LAYERS), "n2_a2_z2_l6": (2, 2, 2, SIX_LAYERS),
        "n3_a2_z0_l6": (3, 2, 0, SIX_LAYERS), "n3_a2_z2_l6": (3, 2, 2, SIX_LAYERS),
        "n2_a2_z1_frozen": (2, 2, 1, FROZEN), "n2_a2_z2_frozen": (2, 2, 2, FROZEN),
        "n2_a1_z3": (2, 1, 3), "n2_a2_z3": (2, 2, 3), "n3_a2_z3": (3, 2, 3),
        "n2_a2_z3_l6": (2, 2, 3, SIX_LAYERS), "n3_a2_z3_l6": (3, 2, 3, SIX_LAYERS),
        "n2_a2_z3_frozen": (2, 2, 3, FROZEN),
        "n2_a2_z0_bf16m": (2, 2, 0, BF16_MOMENTS), "n2_a2_z1_bf16m": (2, 2, 1, BF16_MOMENTS),
        "n2_a2_z3_bf16m": (2, 2, 3, BF16_MOMENTS)}


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    """runs(name): the run folder of RUNS[name], trained on first use."""
    d = tmp_path_factory.mktemp("dp_runs")
    made = {}

    def get(name):
        if name not in made:
            n, a, zero, *more = RUNS[name]
            sets = ([] if zero is None else [f"parallel.zero_stage={zero}"]) + more
            train(corpus, d / name, n, a, *sets)
            made[name] = d / name
        return made[name]
    return get


@needs_mpirun
@pytest.mark.parametrize("name,one", [("n2_a2_z1", "one_a4"), ("n4_a1_z1", "one_a4"),
                                      ("n2_a1_z1", "one_a2"), ("n3_a2_z1", "one_a6"),
                                      ("n2_a2_z2", "one_a4"), ("n3_a2_z2", "one_a6"),
                                      ("n2_a2_z3", "one_a4"), ("n3_a2_z3", "one_a6")])
def test_ranks_log_the_losses_of_one_process_with_their_accumulation(runs, name, one):
    # N ranks x accumulation a against one process with accumulation N*a, the same micro-batch.
    worst = assert_metrics_close(metric_lines(runs(name)), metric_lines(runs(one)), CPU_RTOL, name)
    assert world_sizes(runs(name)) == [RUNS[name][0]] * 8
    # One process logs what it always did: no world_size, no communication time.
    first = json.loads((runs(one) / "metrics.jsonl").read_text().splitlines()[0])
    assert "world_size" not in first and "comm_wait_ms" not in first, first
    print(f"{name} vs {one}: largest relative difference {worst:.3g}")
    assert any(m["split"] == "valid" for m in metric_lines(runs(name)))


@needs_mpirun
@pytest.mark.parametrize("name,world", [("n2_a2_z1", 2), ("n4_a1_z1", 4), ("n3_a2_z1", 3)])
def test_rank_zero_writes_the_run_files_and_each_rank_its_optimizer_shard(runs, name, world):
    dp, one = runs(name), runs("one_a4")
    # The same files as one process's run (rank 0's), but the optimizer state: one shard a rank.
    same = [p for p in files_under(one) if "/optimizer" not in p]
    assert [p for p in files_under(dp) if "/optimizer" not in p] == same
    assert steps_of(dp) == ["step-00000004", "step-00000008"]
    for step in steps_of(dp):
        assert optimizer_files(dp / "checkpoints" / step) == shard_names(world), step
    # Every step logged once (rank 0 alone appends).
    train_steps = [m["step"] for m in metric_lines(dp) if m["split"] == "train"]
    assert train_steps == list(range(1, 9))
    assert optimizer_files(one / "checkpoints" / "step-00000008") == ["optimizer.safetensors"]


def strace_works():
    return shutil.which("strace") is not None and subprocess.run(
        ["strace", "-o", os.devnull, "true"], capture_output=True).returncode == 0


# The system calls by which a process changes the file tree.
WRITE_CALLS = ("open", "openat", "creat", "rename", "renameat", "renameat2", "unlink", "unlinkat",
               "mkdir", "mkdirat", "truncate")


@needs_mpirun
@pytest.mark.skipif(not strace_works(), reason="needs strace (and ptrace) to see the files rank 1 writes")
def test_rank_one_writes_only_its_optimizer_shards(corpus, tmp_path):
    # Rank 1 runs under strace: under the run folder it creates nothing but its optimizer shard of
    # each checkpoint (through a temporary name) and, maybe, the run folder itself.
    trace = tmp_path / "rank1.trace"
    wrapper = tmp_path / "rank_wrapper.sh"
    wrapper.write_text("#!/bin/sh\n"
                       'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then\n'
                       f'  exec strace -f -qq -o "{trace}" -e trace={",".join(WRITE_CALLS)} '
                       f'"{LATHE}" "$@"\n'
                       "fi\n"
                       f'exec "{LATHE}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    r = tmp_path / "r"
    run_ranks(2, train_args(corpus / "tiny.yaml", r, "train.gradient_accumulation_steps=2",
                            "parallel.zero_stage=1", program=wrapper))
    shard = re.compile(re.escape(str(r / "checkpoints")) + r"/\.partial-step-\d{8}/" +
                       re.escape(shard_names(2)[1]) + r"(\.tmp-\d+)?")
    written = []
    for line in trace.read_text().splitlines():
        call = re.match(r"\d+\s+(\w+)\(", line)
        if not call or call.group(1) not in WRITE_CALLS:
            continue
        if call.group(1) in ("open", "openat") and not re.search(r"O_WRONLY|O_RDWR|O_CREAT", line):
            continue
        if re.search(r"= -1 ", line):
            continue  # failed: changed nothing
        written += [p for p in re.findall(r'"([^"]*)"', line) if p.startswith(str(r))]
    assert written, trace.read_text()[-3000:]
    others = [p for p in written if p != str(r) and not shard.fullmatch(p)]
    assert not others, others
    finals = {p for p in written if p.endswith(shard_names(2)[1])}
    assert finals == {str(r / "checkpoints" / f".partial-step-0000000{s}" / shard_names(2)[1])
                      for s in (4, 8)}, finals


@needs_mpirun
@pytest.mark.parametrize("zero0,zero1", [("n2_a2_z0", "n2_a2_z1"), ("n3_a1_z0", "n3_a1_z1")])
def test_zero_0_and_1_give_the_same_bits(runs, zero0, zero1):
    z0, z1 = runs(zero0), runs(zero1)
    assert metric_lines(z0, True) == metric_lines(z1, True)
    for step in steps_of(z1):
        a, b = z0 / "checkpoints" / step, z1 / "checkpoints" / step
        assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes(), step
        # ZeRO-0: every rank holds the whole state, rank 0 writes the full file.
        assert optimizer_files(a) == ["optimizer.safetensors"]
        # The shards' ranges, put in place, are the full file's moments.
        full, shards = canonical_moments(a), canonical_moments(b)
        for key in ("exp_avg", "exp_avg_sq"):
            assert shards[key].tobytes() == full[key].tobytes(), (step, key)


def assert_same_models_and_moments(a, b):
    """Runs a and b wrote the same model files and the same canonical optimizer state."""
    assert steps_of(a) == steps_of(b)
    for step in steps_of(b):
        ca, cb = a / "checkpoints" / step, b / "checkpoints" / step
        assert (ca / "model.safetensors").read_bytes() == (cb / "model.safetensors").read_bytes(), step
        ma, mb = canonical_moments(ca), canonical_moments(cb)
        for key in ("exp_avg", "exp_avg_sq"):
            assert ma[key].tobytes() == mb[key].tobytes(), (step, key)


@needs_mpirun
@pytest.mark.parametrize("other,zero2", [
    ("n2_a1_z1", "n2_a1_z2"), ("n2_a2_z1", "n2_a2_z2"), ("n3_a1_z1", "n3_a1_z2"),
    ("n3_a2_z1", "n3_a2_z2"), ("n2_a2_z1_l6", "n2_a2_z2_l6"), ("n3_a2_z0_l6", "n3_a2_z2_l6"),
    ("n2_a2_z0", "n2_a2_z2"), ("n2_a2_z1_frozen", "n2_a2_z2_frozen")])
def test_zero_2_gives_the_bits_of_zero_0_and_1(runs, other, zero2):
    # Gradients sharded, accumulated per micro-batch in the shard: the same losses, norms,
    # weights and moments as ZeRO 0 and 1 at the same world size, with and without accumulation.
    a, b = runs(other), runs(zero2)
    assert metric_lines(a, True) == metric_lines(b, True)
    assert_same_models_and_moments(a, b)
    world = RUNS[zero2][0]
    for step in steps_of(b):
        assert optimizer_files(b / "checkpoints" / step) == shard_names(world), step
        if RUNS[other][2] == 1:  # ZeRO-2 writes ZeRO-1's shard files, byte for byte
            for name in shard_names(world):
                assert filecmp.cmp(a / "checkpoints" / step / name,
                                   b / "checkpoints" / step / name, shallow=False), (step, name)


@needs_mpirun
@pytest.mark.parametrize("zero2,zero3", [
    ("n2_a1_z2", "n2_a1_z3"), ("n2_a2_z2", "n2_a2_z3"), ("n3_a2_z2", "n3_a2_z3"),
    ("n2_a2_z2_l6", "n2_a2_z3_l6"), ("n3_a2_z2_l6", "n3_a2_z3_l6"), ("n2_a2_z0", "n2_a2_z3"),
    ("n2_a2_z2_frozen", "n2_a2_z3_frozen")])
def test_zero_3_gives_the_bits_of_zero_0_and_2(runs, zero2, zero3):
    # Parameters sharded, each unit gathered from the ranks' shards before it computes: the same
    # losses, norms, moments and model files (gathered to rank 0 for the checkpoint) as ZeRO 0
    # and 2 at the same world size, with and without accumulation, frozen groups and six layers
    # (the layer windows taken in turn in every forward and backward).
    a, b = runs(zero2), runs(zero3)
    assert metric_lines(a, True) == metric_lines(b, True)
    assert_same_models_and_moments(a, b)
    world = RUNS[zero3][0]
    for step in steps_of(b):
        ca, cb = a / "checkpoints" / step, b / "checkpoints" / step
        assert optimizer_files(cb) == shard_names(world), step
        # The model folder: the same files, byte for byte, as the other stage's.
        for name in ("model.safetensors", "config.json"):
            assert filecmp.cmp(ca / name, cb / name, shallow=False), (step, name)
        if RUNS[zero2][2] == 2:  # ZeRO-3 writes ZeRO-2's shard files, byte for byte
            for name in shard_names(world):
                assert filecmp.cmp(ca / name, cb / name, shallow=False), (step, name)


@needs_mpirun
def test_bf16_moments_give_the_same_bits_at_every_zero_stage(runs):
    # The update is elementwise over the moments' storage, so sharding them (ZeRO-1) and the
    # parameters with them (ZeRO-3) changes no bit; the plan halves the optimizer state.
    z0, z1, z3 = runs("n2_a2_z0_bf16m"), runs("n2_a2_z1_bf16m"), runs("n2_a2_z3_bf16m")
    assert metric_lines(z0, True) == metric_lines(z1, True) == metric_lines(z3, True)
    assert_same_models_and_moments(z0, z1)
    assert_same_models_and_moments(z1, z3)
    assert metric_lines(z1, True) != metric_lines(runs("n2_a2_z1"), True)
    for run, f32 in ((z0, "n2_a2_z0"), (z1, "n2_a2_z1")):
        text, rows = plan_of(run)
        assert rows["optimizer state (m, v in bf16)"] * 2 == \
            plan_of(runs(f32))[1]["optimizer state (AdamW m, v)"], text


def plan_of(run_dir):
    """memory_plan.txt of a run: its text and {row name: bytes}."""
    text = (Path(run_dir) / "memory_plan.txt").read_text()
    rows = {}
    for line in text.splitlines():
        m = re.fullmatch(r"  (\S.*?)\s+(\d+) B\s+\S+ \S+", line)
        if m:
            rows[m.group(1)] = int(m.group(2))
    return text, rows


@needs_mpirun
@pytest.mark.parametrize("zero1,zero2", [("n2_a2_z1_l6", "n2_a2_z2_l6"),
                                         ("n3_a2_z0_l6", "n3_a2_z2_l6")])
def test_zero_2_plans_a_gradient_shard_and_windows_instead_of_the_whole_gradients(runs, zero1,
                                                                                zero2):
    world = RUNS[zero2][0]
    t1, r1 = plan_of(runs(zero1))
    t2, r2 = plan_of(runs(zero2))
    assert f"per rank of {world} (ZeRO-2)" in t2, t2
    # On the CPU the parameters are the f32 masters alone: the unsharded gradients' twin.
    assert r1["gradients"] == r1["parameters"] == r2["parameters"], t1
    m = re.search(r"gradients sharded over (\d+) ranks: shard (\d+) B \(.*?\) \+ unit windows "
                  r"(\d+) B \(.*?\), of (\d+) B \(.*?\) unsharded", t2)
    assert m, t2
    shard, windows, whole = int(m.group(2)), int(m.group(3)), int(m.group(4))
    assert int(m.group(1)) == world and whole == r1["gradients"]
    assert shard * world == whole  # every unit padded to a multiple of the ranks' chunks
    assert r2["gradients"] == shard + windows < whole
    # The windows: the front unit (the tied embedding), the back unit (the final norm) and one
    # layer's, each padded like its unit.
    assert 0 < windows < whole - shard
    assert all(r1[k] == r2[k] for k in ("parameters", "activations", "scratch"))
    optimizer = "optimizer state (AdamW m, v)"
    assert r2["total"] - r2["gradients"] - r2[optimizer] == \
        r1["total"] - r1["gradients"] - r1[optimizer]
    assert "gradients sharded" not in t1


@needs_mpirun
@pytest.mark.parametrize("zero2,zero3", [("n2_a2_z2_l6", "n2_a2_z3_l6"),
                                         ("n3_a2_z2_l6", "n3_a2_z3_l6")])
def test_zero_3_plans_a_parameter_shard_and_windows_instead_of_the_whole_parameters(runs, zero2,
                                                                                  zero3):
    world = RUNS[zero3][0]
    t2, r2 = plan_of(runs(zero2))
    t3, r3 = plan_of(runs(zero3))
    assert f"per rank of {world} (ZeRO-3)" in t3, t3
    m = re.search(r"parameters sharded over (\d+) ranks: shard (\d+) B \(.*?\) \+ gathered unit "
                  r"windows (\d+) B \(.*?\), of (\d+) B \(.*?\) unsharded", t3)
    assert m, t3
    shard, windows, whole = int(m.group(2)), int(m.group(3)), int(m.group(4))
    assert int(m.group(1)) == world and whole == r2["parameters"]
    assert shard * world == whole  # every unit padded to a multiple of the ranks' chunks
    # The windows (the CPU computes from f32 masters): the front unit, the back unit and two
    # layers', each padded like its unit; with six layers less than the rest of the model.
    assert 0 < windows < whole - shard
    assert r3["parameters"] == shard + windows < whole
    # Gradients and optimizer state as ZeRO-2's; nothing else changes.
    optimizer = "optimizer state (AdamW m, v)"
    assert all(r2[k] == r3[k] for k in ("gradients", optimizer, "activations", "scratch"))
    assert r2["total"] - r3["total"] == whole - shard - windows
    assert "parameters sharded" not in t2


@needs_mpirun
@pytest.mark.parametrize("name,again", [("n2_a2_z1", "n2_a2_z1_again"),
                                        ("n2_a2_z2", "n2_a2_z2_again")])
def test_the_same_command_twice_gives_the_same_bits(runs, name, again):
    a, b = runs(name), runs(again)
    assert metric_lines(a, True) == metric_lines(b, True)
    assert_same_files(a / "checkpoints", b / "checkpoints")


@pytest.fixture(scope="module")
def long_reference(corpus, tmp_path_factory):
    """An uninterrupted 2-rank run long enough that a kill lands mid-run on any machine."""
    d = tmp_path_factory.mktemp("dp_long") / "ref"
    sets = long_run_sets()
    run_ranks(2, train_args(corpus / "tiny.yaml", d, "train.gradient_accumulation_steps=2", *sets))
    return d, sets


def long_run_sets():
    return ("train.steps=200", "train.eval_interval=50", "checkpoint.interval=16",
            "checkpoint.keep_last=2")


@needs_mpirun
@pytest.mark.parametrize("rank,at_step", [(1, 20), (0, 45)])
def test_sigkill_of_a_rank_ends_the_job_and_the_rerun_resumes_exactly(corpus, tmp_path,
                                                                      long_reference, rank,
                                                                      at_step):
    ref, sets = long_reference
    killed = tmp_path / "killed"
    args = train_args(corpus / "tiny.yaml", killed, "train.gradient_accumulation_steps=2", *sets)
    kill_rank_mid_run(mpirun_args(2, args), killed, rank, at_step, 2, mpi_env())
    assert not (killed / "checkpoints" / "step-00000200").exists()
    assert "resuming from" in run_ranks(2, args).stderr
    assert metric_lines(killed, True) == metric_lines(ref, True)
    assert_same_files(killed / "checkpoints", ref / "checkpoints")


@needs_mpirun
def test_sigkill_of_a_zero_2_rank_resumes_with_the_bits_of_the_uninterrupted_run(corpus, tmp_path,
                                                                               long_reference):
    # The reference runs at ZeRO-1, whose bits ZeRO-2 gives: the killed ZeRO-2 job, rerun, ends
    # with the reference's metrics, weights and optimizer state.
    ref, sets = long_reference
    killed = tmp_path / "killed"
    args = train_args(corpus / "tiny.yaml", killed, "train.gradient_accumulation_steps=2",
                      "parallel.zero_stage=2", *sets)
    kill_rank_mid_run(mpirun_args(2, args), killed, 1, 20, 2, mpi_env())
    assert not (killed / "checkpoints" / "step-00000200").exists()
    assert "resuming from" in run_ranks(2, args).stderr
    assert metric_lines(killed, True) == metric_lines(ref, True)
    assert_same_models_and_moments(killed, ref)


def stopped_after_step_4(src, r):
    """r: a copy of the run src as if stopped after its step-4 checkpoint (metrics.jsonl still
    holding the lines of later steps, as after a kill)."""
    shutil.copytree(src, r)
    shutil.rmtree(r / "checkpoints" / "step-00000008")
    (r / "checkpoints" / "latest").write_text("step-00000004\n")


@needs_mpirun
@pytest.mark.parametrize("name,world,accumulation,zero", [
    ("n2_a2_z1", 1, 4, 1), ("n2_a2_z1", 4, 1, 1), ("n3_a2_z1", 2, 3, 1), ("n3_a2_z1", 2, 3, 0),
    ("n2_a2_z0", 4, 1, 1), ("n3_a2_z1", 2, 3, 2), ("n2_a2_z2", 4, 1, 2), ("n3_a2_z2", 2, 3, 0),
    ("n2_a2_z2", 1, 4, 2), ("n2_a2_z0", 4, 1, 2), ("n2_a2_z3", 1, 4, 3), ("one_a4", 2, 2, 3),
    ("n3_a2_z3", 2, 3, 3), ("n2_a2_z3", 4, 1, 1)])
def test_a_checkpoint_resumes_at_another_world_size(runs, tmp_path, corpus, name, world,
                                                    accumulation, zero):
    # Resumed by `world` ranks with ranks x accumulation unchanged: the optimizer state re-sharded
    # (3 -> 2: other chunks and another padding of every unit), at the same or the other stage.
    src, n = runs(name), RUNS[name][0]
    r = tmp_path / "r"
    stopped_after_step_4(src, r)
    p = train(corpus, r, world, accumulation, f"parallel.zero_stage={zero}")
    assert "resuming from" in p.stderr, p.stderr
    got, want = metric_lines(r), metric_lines(src)
    assert got[:5] == want[:5]  # the lines through the checkpoint (train 1-4, valid 4) stay
    worst = assert_metrics_close(got, want, CPU_RTOL, f"{n} ranks -> {world}")
    assert world_sizes(r) == [n] * 4 + [world] * 4
    print(f"{n} ranks -> {world}: largest relative difference {worst:.3g}")
    full = world == 1 or zero == 0
    want_optimizer = ["optimizer.safetensors"] if full else shard_names(world)
    assert optimizer_files(r / "checkpoints" / "step-00000008") == want_optimizer
    written = ["optimizer.safetensors"] if RUNS[name][2] in (0, None) else shard_names(n)
    assert optimizer_files(r / "checkpoints" / "step-00000004") == written


@needs_mpirun
@pytest.mark.parametrize("name,zero", [("n2_a2_z0", 1), ("n2_a2_z1", 0), ("n2_a2_z0", 2),
                                       ("n2_a2_z1", 2), ("n2_a2_z2", 0), ("n2_a2_z2", 1),
                                       ("n2_a2_z3", 0), ("n2_a2_z3", 2), ("n2_a2_z1", 3)])
def test_a_checkpoint_resumes_at_the_other_zero_stage_with_the_same_bits(runs, tmp_path, corpus,
                                                                         name, zero):
    # The full optimizer file read into shards, or the shards into every rank's whole state: the
    # run goes on with the bits of the uninterrupted one (ZeRO 0, 1 and 2 compute the same bits).
    src = runs(name)
    r = tmp_path / "r"
    stopped_after_step_4(src, r)
    p = train(corpus, r, 2, 2, f"parallel.zero_stage={zero}")
    assert "resuming from" in p.stderr, p.stderr
    assert metric_lines(r, True) == metric_lines(src, True)
    last = "checkpoints/step-00000008/"
    assert (r / last / "model.safetensors").read_bytes() == \
        (src / last / "model.safetensors").read_bytes()
    want = shard_names(2) if zero >= 1 else ["optimizer.safetensors"]
    assert optimizer_files(r / last) == want


@needs_mpirun
def test_a_checkpoint_whose_shard_set_is_incomplete_is_never_resumed_from(runs, corpus, tmp_path):
    # A kill while the ranks write step 8 leaves its unpublished ".partial-" folder with one shard:
    # the rerun resumes from step 4 and ends as the uninterrupted run did.
    src = runs("n2_a2_z1")
    r = tmp_path / "r"
    shutil.copytree(src, r)
    ck = r / "checkpoints"
    (ck / "step-00000008").rename(ck / ".partial-step-00000008")
    (ck / ".partial-step-00000008" / shard_names(2)[1]).unlink()
    (ck / "latest").write_text("step-00000004\n")
    p = train(corpus, r, 2, 2, "parallel.zero_stage=1")
    assert "resuming from" in p.stderr and "step-00000004" in p.stderr, p.stderr
    assert metric_lines(r, True) == metric_lines(src, True)
    assert_same_files(ck, src / "checkpoints")


def error_lines(stderr):
    assert "terminate called" not in stderr and "what():" not in stderr, stderr
    errors = {l for l in stderr.splitlines() if l.startswith("lathe: error: ")}
    assert errors, stderr
    return errors


@needs_mpirun
def test_ranks_with_different_configurations_are_refused_naming_the_key(corpus, tmp_path):
    # Rank 1 of 2 gets another learning rate through a wrapper that reads its rank.
    wrapper = tmp_path / "rank_wrapper.sh"
    wrapper.write_text("#!/bin/sh\n"
                       'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then\n'
                       f'  exec "{LATHE}" "$@" --set optimizer.lr=1.0e-3\n'
                       "fi\n"
                       f'exec "{LATHE}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    r = tmp_path / "r"
    t0 = time.time()
    p = run_ranks(2, train_args(corpus / "tiny.yaml", r, program=wrapper), check=False, timeout=120)
    assert p.returncode != 0, p.stderr
    errors = error_lines(p.stderr)
    assert any("optimizer.lr" in e for e in errors), p.stderr
    assert time.time() - t0 < 60
    assert not (r / "checkpoints").exists() or not steps_of(r)
    assert not (r / "metrics.jsonl").exists() or not (r / "metrics.jsonl").read_text()


@needs_mpirun
def test_the_overlapped_optimizer_schedule_is_refused_naming_the_key(corpus, tmp_path):
    # optimizer.schedule: overlapped steps one process's device optimizer; the ranks keep the
    # serial schedule (optim/adamw_optimizer.h).
    r = tmp_path / "r"
    p = run_ranks(2, train_args(corpus / "tiny.yaml", r, "optimizer.schedule=overlapped"),
                  check=False, timeout=120)
    assert p.returncode != 0, p.stderr
    errors = error_lines(p.stderr)
    assert any("optimizer.schedule" in e and "keeps the serial schedule" in e
               for e in errors), p.stderr
    assert not (r / "checkpoints").exists() or not steps_of(r)


@needs_mpirun
@pytest.mark.parametrize("stage", [4, -1])
def test_unknown_zero_stages_are_refused_naming_the_key(corpus, tmp_path, stage):
    r = tmp_path / "r"
    p = run_ranks(2, train_args(corpus / "tiny.yaml", r, f"parallel.zero_stage={stage}"),
                  check=False, timeout=120)
    assert p.returncode != 0, p.stderr
    errors = error_lines(p.stderr)
    assert any("parallel.zero_stage" in e and "unknown key" not in e for e in errors), p.stderr
    assert not (r / "checkpoints").exists() or not steps_of(r)


def stop_rank_1_mid_run(cmd, run_dir, wait_s):
    """Starts the job `cmd`, SIGSTOPs its rank 1 once step 5 is logged and waits (at most wait_s)
    for the job to end by itself; returns (process, its stderr, seconds after the SIGSTOP)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=mpi_env())
    try:
        wait_for_step(run_dir, 5, p)
        pids = rank_pids(p.pid)
        assert sorted(pids) == [0, 1], pids
        os.kill(pids[1], signal.SIGSTOP)
        t0 = time.time()
        _, err = p.communicate(timeout=wait_s)
        waited = time.time() - t0
    finally:
        stop_job(p)  # rank 1 too, stopped, if the job outlived the test
    return p, err, waited


@needs_mpirun
def test_a_rank_that_stops_answering_stops_the_run_within_the_timeout(corpus, tmp_path):
    # SIGSTOP rank 1 mid-run: rank 0 waits in a collective until parallel.timeout_s, then the job
    # ends (non-zero) with a message naming the wait, instead of hanging.
    timeout_s = 3
    r = tmp_path / "r"
    args = train_args(corpus / "tiny.yaml", r, "train.gradient_accumulation_steps=2",
                      *long_run_sets(), f"parallel.timeout_s={timeout_s}")
    p, err, waited = stop_rank_1_mid_run(mpirun_args(2, args), r, timeout_s + 40)
    assert p.returncode != 0, err
    # The watchdog checks at least every timeout / 4 and gives MPI_Abort 10 s (dist/watchdog.h).
    assert waited < timeout_s + 10 + 10, waited
    assert not (r / "checkpoints" / "step-00000200").exists()
    errors = error_lines(err)
    print("\n".join(errors))
    assert any("parallel.timeout_s" in e for e in errors), err


# ---- GPUs: `lathe launch --gpus 2` ------------------------------------------------------------

def gpu_count():
    """The GPUs this process's children see: nvidia-smi -L's list, cut to CUDA_VISIBLE_DEVICES
    where that is set (nvidia-smi ignores it; lathe's ranks do not)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    n = sum(l.startswith("GPU ") for l in p.stdout.splitlines()) if p.returncode == 0 else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        n = min(n, len([d for d in visible.split(",") if d.strip()]))
    return n


@pytest.fixture(scope="module")
def gpus():
    n = gpu_count()
    if n < 2:
        pytest.skip(NEEDS_CUDA + f"needs 2 GPUs, nvidia-smi -L lists {n}")
    return n


@pytest.fixture(scope="module")
def gpu_corpus(tmp_path_factory, gpus):
    d = tmp_path_factory.mktemp("dp_gpu_corpus")
    write_gcide_jsonl(d / "c.jsonl", 600_000)
    tokenize_corpus(d / "c.jsonl", d / "tok.json", d / "gc", 384)
    return d


def gpu_train_args(corpus, run_dir, accumulation, *sets, steps=20, interval=10, keep=0):
    # configs/tiny.yaml (4 layers, hidden 192, T 128, micro-batch 8) on cuda, every step logged.
    return train_args(ROOT / "configs" / "tiny.yaml", run_dir,
                      f"data.path={corpus / 'gc'}", f"data.tokenizer={corpus / 'tok.json'}",
                      "train.device=cuda", f"train.steps={steps}", "train.log_interval=1",
                      "train.eval_interval=0", f"checkpoint.interval={interval}",
                      f"checkpoint.keep_last={keep}",
                      f"train.gradient_accumulation_steps={accumulation}", *sets)


def launch_args(n, args, *options):
    return [LATHE, "launch", "--gpus", str(n), *options] + args


def launch(n, args, timeout=600):
    p = subprocess.run(launch_args(n, args), capture_output=True, text=True, timeout=timeout,
                       env=mpi_env())
    if p.returncode != 0:
        raise AssertionError(f"lathe launch --gpus {n} failed ({p.returncode}):\n{p.stderr}")
    return p


# The bf16 tolerance of 2 GPUs x accumulation 1 against one GPU x accumulation 2. Both compute each
# micro-batch's forward and backward with the same kernels on the same bf16 weights, so step 1's
# loss differs only in the f32 mean over the two micro-batches. The f32 parameter gradients
# (docs/CUDA.md) differ by the order of one f32 add of the two micro-batches' terms (NCCL's sum
# against cuBLAS's beta = 1 accumulate): per element at most 2 * 2^-24 = 1.2e-7 of |g0| + |g1|, a
# gradient rel-L2 difference s <= 1.2e-5 even where the two terms cancel a hundredfold. AdamW
# turns a gradient difference s into step losses drifting by <= 0.075 sqrt(s) (docs/CUDA.md's
# measurement, bench/adamw_drift.cpp): 2.6e-4. A master that moved by that changes its bf16
# compute copy by one bf16 rounding (u = 2^-8) at most, and only where it sat at a rounding
# boundary. One u of the loss bounds both: each step's loss within 2^-8 = 3.9e-3 relative, 15
# times the drift bound. The test prints the largest difference it saw.
GPU_RTOL = 2.0 ** -8


def test_gpus_log_the_losses_of_one_gpu_with_their_accumulation(gpu_corpus, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    run(gpu_train_args(gpu_corpus, one, 2)[1:], env=mpi_env())
    launch(2, gpu_train_args(gpu_corpus, two, 1))
    got, want = metric_lines(two), metric_lines(one)
    worst = max(abs(g["loss"] - w["loss"]) / abs(w["loss"]) for g, w in zip(got, want))
    print(f"2 GPUs vs one GPU with accumulation 2: largest relative loss difference {worst:.3g} "
          f"(tolerance {GPU_RTOL:.3g})")
    assert [(m["step"], m["lr"], m["tokens"]) for m in got] == \
           [(m["step"], m["lr"], m["tokens"]) for m in want]
    assert worst <= GPU_RTOL, (got, want)
    assert optimizer_files(two / "checkpoints" / "step-00000020") == shard_names(2)


def test_gpus_zero_0_and_1_give_the_same_bits(gpu_corpus, tmp_path):
    z0, z1 = tmp_path / "z0", tmp_path / "z1"
    launch(2, gpu_train_args(gpu_corpus, z0, 1, "parallel.zero_stage=0"))
    launch(2, gpu_train_args(gpu_corpus, z1, 1, "parallel.zero_stage=1"))
    assert metric_lines(z0, True) == metric_lines(z1, True)
    for step in steps_of(z1):
        a, b = z0 / "checkpoints" / step, z1 / "checkpoints" / step
        assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes(), step


@pytest.mark.parametrize("accumulation", [1, 2])
def test_gpus_zero_2_gives_the_bits_of_zero_1(gpu_corpus, tmp_path, accumulation):
    # configs/tiny.yaml with 8 layers: both layer windows are taken in turn four times in every
    # backward, the compute stream waiting on events for the reductions that last read them; and
    # half the model plus the windows (front, back, two layers) is less than the whole gradients
    # (at its 4 layers and 2 ranks it would not be).
    z1, z2 = tmp_path / "z1", tmp_path / "z2"
    layers = "model.num_hidden_layers=8"
    launch(2, gpu_train_args(gpu_corpus, z1, accumulation, "parallel.zero_stage=1", layers))
    launch(2, gpu_train_args(gpu_corpus, z2, accumulation, "parallel.zero_stage=2", layers))
    assert metric_lines(z1, True) == metric_lines(z2, True)
    assert_same_models_and_moments(z1, z2)
    _, r1 = plan_of(z1)
    t2, r2 = plan_of(z2)
    m = re.search(r"gradients sharded over 2 ranks: shard (\d+) B \(.*?\) \+ unit windows "
                  r"(\d+) B", t2)
    assert m and 2 * int(m.group(1)) == r1["gradients"], t2
    assert r2["gradients"] == int(m.group(1)) + int(m.group(2)) < r1["gradients"], t2


@pytest.mark.parametrize("accumulation,precision", [(1, "bf16"), (2, "bf16"), (2, "fp8")])
def test_gpus_zero_3_gives_the_bits_of_zero_2(gpu_corpus, tmp_path, accumulation, precision):
    # configs/tiny.yaml with 8 layers: both layer weight windows are taken in turn four times in
    # every forward and every backward, each gather issued on the communication stream one layer
    # ahead and waited for on the compute stream with an event. The bf16 weights each unit
    # gathers are the bf16 copy ZeRO-2 gathers after its update, so every bit is the same, and
    # the model file gathered to rank 0 for the checkpoint is ZeRO-2's. In fp8 (tensorwise) each
    # layer's weight codes are cast from its gathered window at the first forward after an update.
    # Validation every 10 steps over 3 micro-batches: rank 1 runs a forward past the last one
    # (every rank gathers the layers with the other), whose loss it drops.
    z2, z3 = tmp_path / "z2", tmp_path / "z3"
    sets = ("model.num_hidden_layers=8", "train.eval_interval=10", "train.eval_iters=3",
            f"train.precision={precision}")
    launch(2, gpu_train_args(gpu_corpus, z2, accumulation, "parallel.zero_stage=2", *sets))
    launch(2, gpu_train_args(gpu_corpus, z3, accumulation, "parallel.zero_stage=3", *sets))
    assert metric_lines(z2, True) == metric_lines(z3, True)
    assert_same_models_and_moments(z2, z3)
    # Memory: the parameters (f32 masters and bf16 copy) are half of ZeRO-2's plus the windows
    # (bf16: front, back, two layers), less than the whole.
    _, r2 = plan_of(z2)
    t3, r3 = plan_of(z3)
    m = re.search(r"parameters sharded over 2 ranks: shard (\d+) B \(.*?\) \+ gathered unit "
                  r"windows (\d+) B", t3)
    assert m and 2 * int(m.group(1)) == r2["parameters"], t3
    assert r3["parameters"] == int(m.group(1)) + int(m.group(2)) < r2["parameters"], t3
    assert r3["gradients"] == r2["gradients"], t3
    # comm_wait_ms counts the gathers' waits: logged on every train line.
    lines = [json.loads(l) for l in (z3 / "metrics.jsonl").read_text().splitlines()]
    assert all(l["comm_wait_ms"] >= 0 for l in lines if l["split"] == "train"), lines[:2]


@pytest.mark.parametrize("first,then", [(3, 2), (2, 3)])
def test_gpus_a_checkpoint_resumes_across_zero_3_with_the_same_bits(gpu_corpus, tmp_path, first,
                                                                     then):
    # 20 steps at ZeRO-`first`, checkpoints at 10 and 20; the run cut back to its step-10
    # checkpoint and resumed at ZeRO-`then` ends with the same metrics, model and moments: a
    # ZeRO-3 checkpoint's model (gathered to rank 0) loads into ZeRO-2's replicated weights, and a
    # ZeRO-2 one into each ZeRO-3 rank's shards (f32 and bf16).
    src, r = tmp_path / "src", tmp_path / "r"
    launch(2, gpu_train_args(gpu_corpus, src, 1, f"parallel.zero_stage={first}"))
    shutil.copytree(src, r)
    shutil.rmtree(r / "checkpoints" / "step-00000020")
    (r / "checkpoints" / "latest").write_text("step-00000010\n")
    p = launch(2, gpu_train_args(gpu_corpus, r, 1, f"parallel.zero_stage={then}"))
    assert "resuming from" in p.stderr, p.stderr
    assert metric_lines(r, True) == metric_lines(src, True)
    assert_same_models_and_moments(r, src)


def test_gpus_zero_2_sigkill_of_a_rank_resumes_exactly(gpu_corpus, tmp_path):
    steps = 400
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    sets = ("parallel.zero_stage=2",)
    launch(2, gpu_train_args(gpu_corpus, ref, 2, *sets, steps=steps, interval=50, keep=2))
    args = gpu_train_args(gpu_corpus, killed, 2, *sets, steps=steps, interval=50, keep=2)
    kill_rank_mid_run(launch_args(2, args, "--grace-s", "5"), killed, 1, 60, 2, mpi_env())
    assert not (killed / "checkpoints" / f"step-{steps:08d}").exists()
    assert "resuming from" in launch(2, args).stderr
    assert metric_lines(killed, True) == metric_lines(ref, True)
    assert_same_files(killed / "checkpoints", ref / "checkpoints")


def test_gpus_sigkill_of_a_rank_resumes_exactly(gpu_corpus, tmp_path):
    # Long enough that the kill lands mid-run: 400 steps of a few milliseconds.
    steps = 400
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    launch(2, gpu_train_args(gpu_corpus, ref, 1, steps=steps, interval=50, keep=2))
    args = gpu_train_args(gpu_corpus, killed, 1, steps=steps, interval=50, keep=2)
    # --grace-s 5: rank 0, told to stop (SIGTERM) while waiting on the dead rank, gets SIGKILL 5 s
    # later instead of 30.
    kill_rank_mid_run(launch_args(2, args, "--grace-s", "5"), killed, 1, 60, 2, mpi_env())
    assert not (killed / "checkpoints" / f"step-{steps:08d}").exists()
    assert "resuming from" in launch(2, args).stderr
    assert metric_lines(killed, True) == metric_lines(ref, True)
    assert_same_files(killed / "checkpoints", ref / "checkpoints")


def test_gpus_under_torchrun_train_as_under_lathe_launch(gpu_corpus, tmp_path):
    # torchrun's own store listens on MASTER_PORT, so lathe's rendezvous for the NCCL id takes
    # MASTER_PORT + 1 (dist/open.h): the same run under torchrun gives lathe launch's bits.
    if importlib.util.find_spec("torch") is None:
        pytest.skip(NEEDS_CUDA + "torchrun (PyTorch) is not installed")
    a, b = tmp_path / "launch", tmp_path / "torchrun"
    launch(2, gpu_train_args(gpu_corpus, a, 1))
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node", "2", "--no-python"] + gpu_train_args(gpu_corpus, b, 1),
                       capture_output=True, text=True, timeout=600, env=mpi_env())
    assert p.returncode == 0, p.stderr
    assert "(torchrun)" in p.stderr, p.stderr
    assert metric_lines(a, True) == metric_lines(b, True)
    for step in steps_of(a):
        assert (a / "checkpoints" / step / "model.safetensors").read_bytes() == \
               (b / "checkpoints" / step / "model.safetensors").read_bytes(), step


def test_gpus_a_rank_that_stops_answering_stops_the_run_within_the_timeout(gpu_corpus, tmp_path):
    # SIGSTOP rank 1 mid-run: rank 0's compute waits on an NCCL all-reduce that never completes;
    # its watchdog ends it (exit 124) after parallel.timeout_s, naming the wait, and lathe launch
    # then stops rank 1 (SIGKILL after --grace-s) and exits with rank 0's code.
    timeout_s = 5
    r = tmp_path / "r"
    args = gpu_train_args(gpu_corpus, r, 1, f"parallel.timeout_s={timeout_s}", steps=100000,
                          interval=0)
    p, err, waited = stop_rank_1_mid_run(launch_args(2, args, "--grace-s", "3"), r,
                                         timeout_s + 60)
    errors = error_lines(err)
    print(f"stopped {waited:.1f} s after the SIGSTOP:\n" + "\n".join(errors))
    assert p.returncode == 124, err
    # The watchdog checks at least every timeout / 4, gives ncclCommAbort 10 s (dist/watchdog.h);
    # then the launcher's grace of 3 s.
    assert waited < timeout_s + 10 + 3 + 10, waited
    assert any("rank 0 of 2" in e and f"did not complete within {timeout_s} s" in e
               for e in errors), err


@needs_mpirun
def test_verbose_shows_each_ranks_tokens_per_second(corpus, tmp_path):
    # Rank 0 alone prints; at -v it also names every rank's own tokens/s at each log line.
    p = run_ranks(2, [LATHE, "-v"] + train_args(corpus / "tiny.yaml", tmp_path / "r")[1:])
    lines = [l for l in p.stderr.splitlines() if "tokens/s per rank:" in l]
    assert len(lines) == 8, p.stderr
    assert all(re.search(r"step \d+: tokens/s per rank: rank 0 \S+, rank 1 \S+$", l) for l in lines)
    assert sum("| loss " in l for l in p.stderr.splitlines()) == 8  # one voice


@needs_mpirun
def test_runs_of_several_epochs_keep_the_one_process_order(tmp_path):
    # A corpus of a few hundred training samples and a run that reads them about twice: the
    # sample index GPT-NeoX builds for the run (its epochs and their shuffles) is sized by the
    # global batch, so 2 ranks x accumulation 1 log the losses of one process x accumulation 2
    # past the first epoch too.
    d = tmp_path / "small"
    d.mkdir()
    write_gcide_jsonl(d / "c.jsonl", 20_000)
    tokenize_corpus(d / "c.jsonl", d / "tok.json", d / "gc", 300)
    cfg = d / "tiny.yaml"
    cfg.write_text(TINY + f"\ndata.path: {d / 'gc'}\ndata.tokenizer: {d / 'tok.json'}\n")
    info = run(["data", "info", d / "gc"]).stdout
    tokens = int(re.search(r"^tokens: (\d+)$", info, re.M).group(1))
    steps = 2 * (tokens * 9 // 10 // 16) // 4 + 1  # twice the training samples, 4 per step
    sets = (f"train.steps={steps}", "train.log_interval=5", "train.eval_interval=0",
            "checkpoint.interval=0")
    one = run(train_args(cfg, tmp_path / "one", "train.gradient_accumulation_steps=2",
                         *sets)[1:], env=mpi_env())
    assert one.returncode == 0
    run_ranks(2, train_args(cfg, tmp_path / "two", "train.gradient_accumulation_steps=1", *sets))
    worst = assert_metrics_close(metric_lines(tmp_path / "two"), metric_lines(tmp_path / "one"),
                                 LONG_RUN_RTOL, "two epochs", LONG_RUN_GRAD_NORM_RTOL)
    print(f"{steps} steps over about {tokens * 9 // 10 // 16} samples: largest relative "
          f"difference {worst:.3g}")
